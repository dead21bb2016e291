"""Holding each tenant of a shared GPU to its share of the GPU's memory.

Every readings cycle the agent first says whose each process is (`attribute`): the booking whose
job's process group it is in, else the one the environment it started with names
(GPU_PORTAL_BOOKING_ID, which the agent sets in every job and children inherit), if that booking
holds the device. The readings go to the portal so (who is on a shared GPU, per tenant).

Then the memory NVML (or the simulator) reports per process is added up per tenant on its GPU; a
process of no tenant counts for none (agents.enforce judges it). A tenant above its share
(DesiredBooking.gpu_memory_mib) for `grace_s` in a row is over: the agent stops that job alone,
and says why ("used 31 GiB of GPU memory, over its 20 GiB share, for 30 s"). A tenant that comes
back under its share before the grace ends starts afresh.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass

from agents.procfs import BOOKING_VAR, read_environ, read_stat
from agents.protocol import DeviceReading, ProcessReading

DEFAULT_GRACE_S = 30.0


@dataclass(frozen=True)
class Tenant:
    """A running job on a shared GPU: its booking, the GPU and its memory share."""

    booking_id: int
    device_uuid: str
    memory_mib: int


@dataclass(frozen=True)
class OverShare:
    """A tenant that stayed above its memory share for the grace period."""

    booking_id: int
    device_uuid: str
    used_mib: int
    share_mib: int
    over_s: float

    def reason(self) -> str:
        """What the job's output, the event and the booking say (in MiB where GiB to a tenth
        would read the same for both)."""
        used, share, unit = gib(self.used_mib), gib(self.share_mib), "GiB"
        if used == share:
            used, share, unit = str(self.used_mib), str(self.share_mib), "MiB"
        return (
            f"used {used} {unit} of GPU memory, over its {share} {unit} share, "
            f"for {self.over_s:.0f} s"
        )


def gib(mib: int) -> str:
    """MiB as GiB, to a tenth, without a trailing .0 (20480 -> "20", 31232 -> "30.5")."""
    return f"{round(mib / 1024, 1):g}"


def attribute(
    readings: list[DeviceReading], jobs: dict[int, int], holding: dict[str, set[int]]
) -> list[DeviceReading]:
    """The readings with each process's booking: `jobs` maps a launched job's process group to
    its booking, `holding` each device to the bookings that hold it now."""
    return [
        dataclasses.replace(
            reading,
            processes=[
                _attributed(p, jobs, holding.get(reading.uuid, set())) for p in reading.processes
            ],
        )
        for reading in readings
    ]


def _attributed(proc: ProcessReading, jobs: dict[int, int], holders: set[int]) -> ProcessReading:
    if not holders:
        return proc
    stat = read_stat(proc.pid)
    if stat is None:
        return proc
    booking = jobs.get(stat.pgid)
    if booking is None:
        named = read_environ(proc.pid, (BOOKING_VAR,)).get(BOOKING_VAR, "")
        booking = int(named) if named.isascii() and named.isdigit() and len(named) < 19 else None
    return dataclasses.replace(proc, booking_id=booking) if booking in holders else proc


def tenant_usage(readings: list[DeviceReading], tenants: list[Tenant]) -> dict[int, int]:
    """The GPU memory (MiB) each tenant's processes use on its GPU now (readings attributed)."""
    used = {tenant.booking_id: 0 for tenant in tenants}
    device = {tenant.booking_id: tenant.device_uuid for tenant in tenants}
    for reading in readings:
        for proc in reading.processes:
            owner = proc.booking_id
            if device.get(owner) == reading.uuid and proc.used_memory_mib is not None:
                used[owner] += proc.used_memory_mib
    return used


class MemoryWatch:
    """Tracks how long each tenant has been above its share; `check` once per readings cycle."""

    def __init__(
        self, grace_s: float = DEFAULT_GRACE_S, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._grace_s = grace_s
        self._clock = clock
        self._over_since: dict[int, float] = {}
        self._told: set[int] = set()

    def check(self, readings: list[DeviceReading], tenants: list[Tenant]) -> list[OverShare]:
        """The tenants over their share for the grace period, each once (readings attributed)."""
        now, found = self._clock(), []
        used = tenant_usage(readings, tenants)
        for tenant in tenants:
            if used[tenant.booking_id] <= tenant.memory_mib:
                self._over_since.pop(tenant.booking_id, None)
                continue
            since = self._over_since.setdefault(tenant.booking_id, now)
            if now - since >= self._grace_s and tenant.booking_id not in self._told:
                self._told.add(tenant.booking_id)
                found.append(
                    OverShare(
                        tenant.booking_id,
                        tenant.device_uuid,
                        used[tenant.booking_id],
                        tenant.memory_mib,
                        max(now - since, self._grace_s),
                    )
                )
        current = {tenant.booking_id for tenant in tenants}
        self._over_since = {pk: at for pk, at in self._over_since.items() if pk in current}
        self._told &= current
        return found
