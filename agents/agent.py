"""The node agent: register, report readings, pull desired state, dispatch, enforce.

`Agent.handle_one_cycle()` does one round of everything that is due and says whether it
found work; `Agent.run()` loops over it. Tests drive cycles directly.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections import deque
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

from agents import __version__, host
from agents.backend import Backend
from agents.backoff import Backoff
from agents.confine import NoConfinement
from agents.confine import choose as choose_confinement
from agents.containers import detect_runtimes
from agents.dispatch import DEFAULT_MIN_UID, Dispatcher, active_bookings
from agents.enforce import Enforcer, Holder
from agents.memshare import DEFAULT_GRACE_S as DEFAULT_MEMORY_GRACE_S
from agents.memshare import MemoryWatch, Tenant, attribute
from agents.mig_layouts import MigLayouts
from agents.portal import PortalClient, PortalError, PortalUnavailable, Rejected
from agents.protocol import (
    DesiredBooking,
    DesiredState,
    DeviceReading,
    Event,
    EventsRequest,
    ReadingsRequest,
    RegisterRequest,
    utcnow,
)
from agents.session import DEFAULT_HOST as DEFAULT_SESSION_HOST
from agents.sharing import MpsDaemons

log = logging.getLogger(__name__)

DEFAULT_REPORT_INTERVAL_S = 5.0
DEFAULT_SYNC_INTERVAL_S = 30.0
# Failures of the portal this long in a row are a warning; shorter ones only INFO.
WARN_AFTER_S = 10.0
_EVENT_BATCH = 100
_MAX_IDLE_WAIT_S = 1.0  # also how soon an exited job is noticed


class Agent:
    """One node's agent; everything but the GPU backend and the clocks has a default."""

    def __init__(
        self,
        portal_url: str,
        token: str,
        backend: Backend,
        *,
        hostname: str | None = None,
        state_dir: str | Path = "/var/lib/gpu-portal-agent",
        user_map: dict[str, str] | None = None,
        policy: str | None = None,
        report_interval_s: float | None = None,
        sync_interval_s: float | None = None,
        grace_s: float = 30.0,
        stop_jobs_on_exit_s: float | None = None,
        push: bool = True,
        push_url: str | None = None,
        max_queued_events: int = 10_000,
        min_uid: int = DEFAULT_MIN_UID,
        confine: str = "auto",
        session_host: str = DEFAULT_SESSION_HOST,
        session_python: str | None = None,
        session_dir: str | None = None,
        address: str | None = None,
        default_workdir: str | None = None,
        container_runtimes: list[str] | None = None,
        container_args: dict[str, list[str]] | None = None,
        container_devices: bool = True,
        mps: bool = False,
        memory_grace_s: float = DEFAULT_MEMORY_GRACE_S,
        reserved_cpus: int = 0,
        reserved_memory_mib: int = 0,
        clock: Callable[[], float] = time.monotonic,
        now: Callable[[], datetime] = utcnow,
    ) -> None:
        self.hostname = hostname or socket.gethostname()
        # Where other nodes' ranks reach this one (MASTER_ADDR when it is rank 0); the portal
        # uses the hostname when none is given.
        self.address = address
        self.backend = backend
        # --mps: one MPS control daemon per shared GPU with tenants (agents/sharing.py).
        self.mps = MpsDaemons(state_dir) if mps else None
        self.portal = PortalClient(portal_url, token)
        # What jobs may use, after what the site keeps for the system: this machine's cores
        # (the ones cpusets are made of) and what the node reports (a simulated SPEC's own).
        self._inventory = backend.discover()
        machine = host.read_machine()
        reported = getattr(backend, "host", lambda: None)() or machine
        reserve = {"cpus": reserved_cpus, "memory_mib": reserved_memory_mib}
        self.host = host.reserve(reported, **reserve)
        if reported is not machine:  # simulated: cpusets still come from the real cores
            reserve["cpus"] = min(reserved_cpus, len(machine.cpus) - 1)
            reserve["memory_mib"] = min(reserved_memory_mib, machine.memory_mib - 1)
        self.machine = host.reserve(machine, **reserve)
        self.confinement = choose_confinement(confine, agent=self.hostname)
        if isinstance(self.confinement, NoConfinement) and confine != "off":
            log.warning(
                "jobs are not confined to their devices (CUDA_VISIBLE_DEVICES only): %s",
                self.confinement.reason,
            )
        else:
            log.info("job confinement: %s", self.confinement.how)
        self.dispatcher = Dispatcher(
            state_dir,
            user_map,
            grace_s,
            clock,
            min_uid,
            confinement=self.confinement,
            device_files=backend.device_files,
            session_host=session_host,
            session_python=session_python,
            session_dir=session_dir,
            hostname=self.hostname,
            address=address or DEFAULT_SESSION_HOST,
            default_workdir=default_workdir,
            # None: what is installed (agents/containers.py); [] turns containers off.
            container_runtimes=detect_runtimes()
            if container_runtimes is None
            else container_runtimes,
            container_args=container_args,
            container_devices=container_devices,
            mps=self.mps,
            machine=self.machine,
            gpu_numa=_gpu_numa(self._inventory),
        )
        self.enforcer = Enforcer(grace_s, clock)
        self.memory_watch = MemoryWatch(memory_grace_s, clock)
        self._stop_jobs_on_exit_s = stop_jobs_on_exit_s
        self.events: deque[Event] = deque(maxlen=max_queued_events)
        self.desired: DesiredState | None = None
        self._cli = {"policy": policy, "report": report_interval_s, "sync": sync_interval_s}
        self.policy = policy or "report"
        self.report_interval_s = _given(report_interval_s, DEFAULT_REPORT_INTERVAL_S)
        self.sync_interval_s = _given(sync_interval_s, DEFAULT_SYNC_INTERVAL_S)
        self._clock, self._now = clock, now
        self._push_enabled = push
        self._push_url = push_url or self.portal.websocket_url
        self._push = None
        self._backoff = Backoff()
        self._registered = False
        self._offline_until: float | None = None
        self._failing_since: float | None = None
        self._next_report = self._next_sync = 0.0
        self._pull_requested = False
        self._dropped_events = 0
        self._events_seen = 0
        self._mig_children = {g.uuid: [m.uuid for m in g.mig_instances] for g in self._inventory}
        self.mig_layouts = MigLayouts(backend)
        self.stopping = threading.Event()
        self._wake = threading.Event()

    # -- lifecycle ---------------------------------------------------------------------

    def start(self) -> None:
        """Re-adopt what a previous agent launched, and open the push websocket."""
        self._queue(self.dispatcher.adopt(self._now()))
        if self._push_enabled:
            from agents.push import PushListener  # websockets is only needed for push

            self._push = PushListener(
                self._push_url, self.portal.auth_header, self.on_push, self.on_reconnect
            )
            self._push.start()

    def run(self) -> None:
        """Cycle until `stop()` (SIGTERM); running jobs keep running, to be re-adopted, unless
        `stop_jobs_on_exit_s` is set."""
        self.start()
        try:
            while not self.stopping.is_set():
                if not self.handle_one_cycle():
                    self._wake.wait(self._idle_wait())
                    self._wake.clear()
        finally:
            self.close()

    def stop(self) -> None:
        """Ask `run()` to return after the current cycle; safe from a signal handler."""
        self.stopping.set()
        self._wake.set()

    def close(self) -> None:
        """Stop the jobs if asked; close the websocket and the backend, flush what can be
        flushed, save state.

        Jobs stopped here are reported as stopped by the agent; while those events are not
        sent, the state file keeps the jobs (so marked) for the next agent to report."""
        stopped = self._stop_jobs_on_exit_s is not None
        if stopped:
            self._queue(self.dispatcher.stop_all(self._stop_jobs_on_exit_s, self._now()))
            if self.mps is not None:
                self.mps.stop_all()  # their tenants are gone; a daemon a job outlived quits too
        else:
            # Jobs left running keep their MPS daemons: the next agent re-adopts both.
            self.dispatcher.save()
        if self._push is not None:
            self._push.stop()
        if self._online():
            try:
                self._flush_events()
            except PortalError as exc:
                log.warning("could not flush %d event(s) on exit: %s", len(self.events), exc)
        if stopped and not self.events:
            self.dispatcher.save()  # the portal has heard: the next agent has nothing to tell
        self.backend.close()
        getattr(self.confinement, "close", lambda: None)()

    def on_push(self, generation: int) -> None:
        """The portal says desired state changed: pull it at once (called from the ws thread)."""
        if self.desired is None or generation != self.desired.generation:
            self._pull_requested = True
            self._wake.set()

    def on_reconnect(self) -> None:
        """The websocket (re)connected: pushes may have been lost, so register and pull again."""
        self._registered = False
        self._offline_until = None
        self._wake.set()

    # -- one cycle ---------------------------------------------------------------------

    def handle_one_cycle(self) -> bool:
        """Do whatever is due once; True when work was found (an event, a launch, a kill).

        Raises AuthError when the portal refuses the token; everything else is survived.
        """
        now = self._now()
        events_before = self._events_seen
        self._talk(self._sync, registered=False)
        self._queue(self.dispatcher.reconcile(self._bookings(), now))
        relayout = self._apply_mig_layouts(now)
        readings = self._sample_if_due()
        if readings is not None:
            readings = self._attributed(readings, now)
            self._talk(lambda: self._send_readings(readings, now))
            self._queue(self._enforce(readings, now))
            self._queue(self._hold_shares(readings, now))
            # A running job's output rides along at the readings' pace, not as new work.
            self._queue_output(self.dispatcher.output(now))
        escalated = self.enforcer.escalate()
        self._talk(self._flush_events)
        # Queued-but-unsent events are not new work: counting them would spin while offline.
        return relayout or escalated or self._events_seen > events_before

    def _talk(self, call: Callable[[], object], *, registered: bool = True) -> None:
        # While the portal is down (in backoff) no request is tried; work goes on locally.
        # Only a registered agent posts: when a backoff runs out mid-cycle, after this cycle's
        # sync was skipped, readings and events wait for the next cycle's registration.
        if not self._online() or (registered and not self._registered):
            return
        try:
            call()
        except (PortalUnavailable, Rejected) as exc:
            delay = self._backoff.next_delay()
            self._log_failure(exc, delay)
            self._offline_until = self._clock() + delay
            self._registered = False
        else:
            self._backoff.reset()
            self._failing_since = None

    def _log_failure(self, exc: Exception, delay: float) -> None:
        """A warning once the portal has failed for WARN_AFTER_S; a blip (a portal restarting,
        or stopping before its agents as `manage.py up` does) is INFO only."""
        now = self._clock()
        if self._failing_since is None:
            self._failing_since = now
        failing_s = now - self._failing_since
        level = logging.WARNING if failing_s >= WARN_AFTER_S else logging.INFO
        log.log(
            level,
            "portal request failed (%s) for %.0f s; retrying in %.1f s",
            exc,
            failing_s,
            delay,
        )

    def _online(self) -> bool:
        return self._offline_until is None or self._clock() >= self._offline_until

    def _sync(self) -> None:
        if not self._registered:
            self._register()
        if self._pull_requested or self._clock() >= self._next_sync:
            self._pull_requested = False
            self._next_sync = self._clock() + self.sync_interval_s
            self.desired = self.portal.get_desired()

    def _register(self) -> None:
        request = RegisterRequest(
            self.hostname,
            __version__,
            self._inventory,
            address=self.address,
            container_runtimes=self.dispatcher.container_runtimes,
            mig_changes=list(self.mig_layouts.results),
            cpus=len(self.host.cpus),
            memory_mib=self.host.memory_mib,
            numa_cpus=self.host.numa_cpus(),
        )
        answer = self.portal.register(request)
        self.mig_layouts.results.clear()
        log.info("registered as %s (enforcement %s)", answer.node, answer.enforcement)
        self.policy = self._cli["policy"] or answer.enforcement
        if self._cli["report"] is None:
            self.report_interval_s = answer.report_interval_s
        if self._cli["sync"] is None:
            self.sync_interval_s = answer.sync_interval_s
        self._registered = True
        self._offline_until = None
        self._pull_requested = True  # whatever changed while away: pull it now

    def _apply_mig_layouts(self, now: datetime) -> bool:
        """Apply the MIG layout changes the portal asks for (agents.mig_layouts); after one,
        read the inventory again and register, so the portal sees the new instances."""
        if self.desired is None or not self.mig_layouts.apply(
            self.desired, self._mig_children, now
        ):
            return False
        self._inventory = self.backend.discover()
        self._mig_children = {g.uuid: [m.uuid for m in g.mig_instances] for g in self._inventory}
        self._registered = False
        return True

    def _bookings(self) -> list[DesiredBooking] | None:
        return None if self.desired is None else self.desired.bookings

    def _sample_if_due(self) -> list[DeviceReading] | None:
        now = self._clock()
        if now < self._next_report:
            return None
        # Keep to the schedule rather than drift by each cycle's own duration.
        on_time = now - self._next_report < self.report_interval_s
        self._next_report = (self._next_report if on_time else now) + self.report_interval_s
        return self.backend.sample()

    def _send_readings(self, readings: list[DeviceReading], now: datetime) -> None:
        try:
            self.portal.send_readings(ReadingsRequest(self.hostname, now, readings))
        except Rejected as exc:
            log.error("portal rejected readings: %s", exc)

    def _enforce(self, readings: list[DeviceReading], now: datetime) -> list[Event]:
        if self.desired is None:
            return []  # before the first pull every device would look unbooked
        protected = self.dispatcher.own_pgids()
        return self.enforcer.check(readings, self._holders(now), self.policy, protected, now)

    def _holders(self, now: datetime) -> dict[str, list[Holder]]:
        # A shared GPU has a holder per tenant.
        holders: dict[str, list[Holder]] = {}
        for booking in active_bookings(self.desired.bookings, now):
            holder = Holder(
                booking.booking_id, booking.owner, self.dispatcher.unix_user(booking.owner)
            )
            for uuid in booking.device_uuids:
                # A booking of a whole GPU covers its MIG instances too.
                for covered in [uuid, *self._mig_children.get(uuid, [])]:
                    holders.setdefault(covered, []).append(holder)
        return holders

    def _attributed(self, readings: list[DeviceReading], now: datetime) -> list[DeviceReading]:
        """Each process with the booking whose job it is (agents.memshare.attribute)."""
        if self.desired is None:
            return readings
        jobs = {job.pgid: job.booking_id for job in self.dispatcher.jobs.values()}
        holding: dict[str, set[int]] = {}
        for uuid, holders in self._holders(now).items():
            holding[uuid] = {holder.booking_id for holder in holders}
        return attribute(readings, jobs, holding)

    def _hold_shares(self, readings: list[DeviceReading], now: datetime) -> list[Event]:
        """Stop the jobs that stayed above their memory share of a shared GPU (agents.memshare);
        their neighbours run on."""
        if self.desired is None:
            return []
        events = []
        for over in self.memory_watch.check(readings, self._tenants(now)):
            reason = over.reason()
            if self.dispatcher.stop_over_share(over.booking_id, reason):
                events.append(
                    Event(
                        "memory_exceeded",
                        now,
                        reason,
                        over.booking_id,
                        device_uuid=over.device_uuid,
                        action="kill",
                    )
                )
        return events

    def _tenants(self, now: datetime) -> list[Tenant]:
        tenants = []
        for booking in active_bookings(self.desired.bookings, now):
            job = self.dispatcher.jobs.get(booking.booking_id)
            if booking.gpu_memory_mib is None or job is None or job.stop_reason is not None:
                continue
            for uuid in booking.device_uuids[:1]:  # a share is of one GPU
                tenants.append(Tenant(booking.booking_id, uuid, booking.gpu_memory_mib))
        return tenants

    # -- events ------------------------------------------------------------------------

    def _queue(self, events: list[Event]) -> None:
        for event in events:
            log.info(
                "event %s booking=%s pid=%s: %s",
                event.kind,
                event.booking_id,
                event.pid,
                event.detail,
            )
            self._append(event)
            self._events_seen += 1

    def _queue_output(self, events: list[Event]) -> None:
        # Only a job's latest output matters: while the portal is away, a long job's output
        # must not fill the queue and push out the events that end bookings.
        jobs = {event.booking_id for event in events}
        for stale in [e for e in self.events if e.kind == "output" and e.booking_id in jobs]:
            self.events.remove(stale)
        for event in events:
            self._append(event)

    def _append(self, event: Event) -> None:
        if len(self.events) == self.events.maxlen:
            self._dropped_events += 1
            log.warning("event queue full: dropped the oldest (%d so far)", self._dropped_events)
        self.events.append(event)

    def _flush_events(self) -> None:
        while self.events:
            batch = [self.events[i] for i in range(min(_EVENT_BATCH, len(self.events)))]
            try:
                self.portal.send_events(EventsRequest(batch))
            except Rejected as exc:
                log.error("portal rejected %d event(s), dropping them: %s", len(batch), exc)
            for _ in batch:
                self.events.popleft()

    def _idle_wait(self) -> float:
        until_report = self._next_report - self._clock()
        return max(0.0, min(_MAX_IDLE_WAIT_S, until_report))


def _gpu_numa(inventory) -> dict[str, int]:
    """Each GPU's and MIG instance's NUMA node, where the GPU reported one."""
    numa = {}
    for gpu in inventory:
        if gpu.numa_node is not None:
            numa |= {u: gpu.numa_node for u in [gpu.uuid, *(m.uuid for m in gpu.mig_instances)]}
    return numa


def _given(value: float | None, default: float) -> float:
    return default if value is None else value
