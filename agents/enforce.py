"""Enforcement: processes on GPUs that their booking does not cover.

A process on a booked device run by someone other than the booking's Unix user is a
`foreign_process`; a process on a device nobody booked is an `unbooked_process`.
Each is reported once per process; the policy adds a terminal warning or a kill.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from agents.procfs import read_stat, tty_path
from agents.protocol import DeviceReading, Event, ProcessReading

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Holder:
    """Who may use a device right now."""

    booking_id: int
    owner: str
    unix_user: str


class Enforcer:
    """Checks readings against the holders of each device and applies the policy."""

    def __init__(self, grace_s: float = 30.0, clock: Callable[[], float] = time.monotonic):
        self._grace_s = grace_s
        self._clock = clock
        self._reported: set[tuple[int, int, str]] = set()  # (pid, start_ticks, device)
        self._kills: dict[tuple[int, int], float] = {}  # (pid, start_ticks) -> SIGKILL time

    def check(
        self,
        readings: list[DeviceReading],
        holders: dict[str, list[Holder]],
        policy: str,
        protected_pgids: set[int],
        now: datetime,
    ) -> list[Event]:
        """Events for processes not seen before that should not be where they are."""
        events, seen = [], set()
        for reading in readings:
            for proc in reading.processes:
                stat = read_stat(proc.pid)
                if stat is None or proc.pid == os.getpid():
                    continue
                key = (proc.pid, stat.start_ticks, reading.uuid)
                seen.add(key)
                on_device = holders.get(reading.uuid, [])
                protected = stat.pgid in protected_pgids
                if key in self._reported or not _objectionable(proc, on_device, protected):
                    continue
                self._reported.add(key)
                events.append(
                    self._act(
                        proc, stat.start_ticks, reading.uuid, on_device, policy, protected, now
                    )
                )
        self._reported &= seen  # forget exited processes, so pid reuse is judged afresh
        return events

    def _act(
        self,
        proc: ProcessReading,
        start_ticks: int,
        device: str,
        on_device: list[Holder],
        policy: str,
        protected: bool,
        now: datetime,
    ) -> Event:
        holder = on_device[0] if on_device else None
        if holder is None:
            kind, detail = (
                "unbooked_process",
                f"process {proc.pid} ({proc.name}) of {proc.user} "
                f"uses {device}, which no booking holds",
            )
        else:
            kind, detail = (
                "foreign_process",
                f"process {proc.pid} ({proc.name}) of {proc.user} "
                f"uses {device}, booked by "
                + ", ".join(f"{h.owner} (booking {h.booking_id})" for h in on_device),
            )
        # The agent's own launched work is the dispatcher's business, never enforcement's.
        action = "report" if protected and policy == "kill" else policy
        detail += self._apply(action, proc, start_ticks, detail)
        return Event(
            kind,
            now,
            detail,
            holder.booking_id if holder else None,
            device_uuid=device,
            pid=proc.pid,
            user=proc.user,
            action=action,
        )

    def _apply(self, action: str, proc: ProcessReading, start_ticks: int, detail: str) -> str:
        if action == "warn":
            return _warn(proc.pid, detail)
        if action == "kill":
            _send(proc.pid, start_ticks, signal.SIGTERM)
            self._kills[(proc.pid, start_ticks)] = self._clock() + self._grace_s
            return f"; sent SIGTERM, SIGKILL follows in {self._grace_s:g} s"
        return ""

    def escalate(self) -> bool:
        """SIGKILL the killed processes that outlived the grace period; True if any."""
        due = [key for key, at in self._kills.items() if self._clock() >= at]
        for pid, start_ticks in due:
            del self._kills[(pid, start_ticks)]
            _send(pid, start_ticks, signal.SIGKILL)
        return bool(due)


def _objectionable(proc: ProcessReading, holders: list[Holder], protected: bool) -> bool:
    if not holders:
        # The agent's own work outside any booking is being stopped by the dispatcher.
        return not protected
    # On a shared GPU any tenant's user may be there (memory shares are agents.memshare's).
    return proc.user is not None and all(proc.user != h.unix_user for h in holders)


def _send(pid: int, start_ticks: int, signum: int) -> None:
    stat = read_stat(pid)
    if stat is None or stat.start_ticks != start_ticks:
        return  # gone, or the pid now belongs to someone else
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        pass


def _warn(pid: int, detail: str) -> str:
    path = tty_path(pid)
    if path is None:
        return "; no terminal to warn on"
    message = f"\r\n[gpu-portal] {detail}. Please stop it: this GPU is not yours now.\r\n"
    try:
        fd = os.open(path, os.O_WRONLY | os.O_NOCTTY | os.O_NONBLOCK)
        try:
            os.write(fd, message.encode())
        finally:
            os.close(fd)
    except OSError as exc:
        return f"; could not warn on {path}: {exc.strerror}"
    return f"; warned on {path}"
