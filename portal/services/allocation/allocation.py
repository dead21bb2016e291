"""The allocation pass: a snapshot of the ORM in, the pure scheduler's plan out, changes applied.

The scheduler module decides; this service only translates. The same `scheduler.plan` runs in
the Celery worker, in the embedded in-process loop and in the trace replay.

A pass never holds a lock that a person waits on for long. A session advisory lock lets one pass
run at a time; the snapshot is read in one consistent read and planned with no lock at all; each
start is then applied in its own short transaction that locks only that start's nodes (sorted)
and re-checks that its devices are still free and unchanged since the snapshot. A start whose
devices moved on is skipped and planned again next pass; the exclusion constraint on allocations
stays the backstop. The plan's figures for pending bookings are written only where they changed.
"""

import json
import logging
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime

from django.db import connection, transaction

import scheduler
from portal.models import Booking
from portal.services.allocation.mig_changes import mig_changes_advance, mig_layouts_propose
from portal.services.allocation.pass_start import start_planned
from portal.services.allocation.snapshot import (
    Snapshot,
    scheduler_policy,
    share_row,
    snapshot_take,
)
from portal.services.booking import events
from portal.services.booking.bookings import booking_stop, booking_transition
from portal.services.booking.fairshare import fairshare_fold
from portal.services.booking.reservations import reservations_start_due
from portal.services.core import counters
from portal.services.core.clock import from_epoch
from portal.services.core.locking import advisory_unlock, try_session_advisory_lock
from scheduler.mig_layout import change_times

log = logging.getLogger(__name__)
State = Booking.State
PASS_LOCK_KEY = 0x6770755F70617373  # "gpu_pass": one allocation pass at a time, cluster-wide


@dataclass
class PassResult:
    """What one pass did and how long each step took, for logs, tests and the benchmark."""

    ran: bool = True
    started: int = 0
    finished: int = 0
    preempted: int = 0
    pending: int = 0
    skipped: int = 0  # starts whose devices changed since the snapshot (retried next pass)
    never_met: int = 0  # pending bookings ended because a dependency can never be met
    stored: int = 0  # pending bookings whose planned start, position or reason changed
    mig_changes: int = 0  # MIG layout changes planned, started or timed out
    timings: dict[str, float] = field(default_factory=dict)


_local = threading.local()


def allocation_pass(*, now: datetime) -> PassResult:
    """Run one pass: end what is over, start due reservations, plan and start the queue."""
    # The pass commits as it goes, so its own changes ask for a pass; where tasks run eagerly
    # (embedded mode, tests) that would run one inside this one (a session's advisory lock is
    # re-entrant). This pass covers them: its snapshot comes after.
    if getattr(_local, "running", False) or not try_session_advisory_lock(PASS_LOCK_KEY):
        return PassResult(ran=False)
    _local.running = True
    started = time.perf_counter()
    try:
        result = _run(now)
        counters.pass_observe(time.perf_counter() - started)
        return result
    finally:
        _local.running = False
        advisory_unlock(PASS_LOCK_KEY)


def _run(now: datetime) -> PassResult:
    result = PassResult()
    clock = _Clock(result)
    result.finished = _finish_ended(now)
    result.started = reservations_start_due(now=now)
    policy = scheduler_policy()  # one a pass: the fold, the snapshot and the plan share it
    fairshare_fold(now=now, policy=policy)
    clock.lap("housekeeping")
    snap = snapshot_take(now=now, policy=policy)
    result.pending = len(snap.pending)
    clock.lap("snapshot")
    # A planned MIG layout change moves on (planned, applying) whether or not anything waits.
    result.mig_changes = mig_changes_advance(times=change_times(snap.state), now=now)
    result.mig_changes += mig_layouts_propose(state=snap.state, now=now)  # MIG_AUTO_LAYOUT
    if not snap.pending:
        return result
    plan = scheduler.plan(snap.state, snap.policy)
    clock.lap("plan")
    result.never_met = _end_never_met(plan, now)
    result.preempted = _apply_preemptions(plan, now)
    started, skipped = _apply_starts(plan, snap, now)
    result.started += started
    result.skipped = skipped
    clock.lap("start")
    result.stored = _store_plans(plan, snap, now)
    clock.lap("store")
    return result


class _Clock:
    def __init__(self, result: PassResult) -> None:
        self.result, self.last = result, time.perf_counter()

    def lap(self, name: str) -> None:
        now = time.perf_counter()
        self.result.timings[name] = now - self.last
        self.last = now


def _finish_ended(now: datetime) -> int:
    ended = (
        Booking.objects.filter(state=State.ACTIVE)
        .exclude(allocations__live=True, allocations__end__gt=now)
        .values_list("pk", flat=True)
    )
    count = 0
    for booking_id in list(ended):
        with transaction.atomic(durable=True):
            if booking_transition(
                booking_id,
                to=State.FINISHED,
                now=now,
                detail="reached its end time",
            ):
                events.booking_changed(Booking(pk=booking_id), "finished")
                count += 1
    return count


def _end_never_met(plan, now: datetime) -> int:
    """Cancel the pending bookings whose dependencies can never be met, saying why."""
    details = {line.booking_id: line.detail for line in plan.planned}
    count = 0
    for booking_id in plan.never_met:
        with transaction.atomic(durable=True):
            detail = details[booking_id][:300]
            if booking_transition(int(booking_id), to=State.CANCELLED, now=now, detail=detail):
                events.booking_changed(Booking(pk=int(booking_id)), "cancelled")
                count += 1
    return count


def _apply_preemptions(plan, now: datetime) -> int:
    count = 0
    for preemption in plan.preemptions:
        detail = f"preempted for booking {preemption.for_booking_id}"
        if preemption.reason:  # a reclaim of borrowed devices
            detail = f"{preemption.reason} (booking {preemption.for_booking_id})"
        with transaction.atomic(durable=True):
            if booking_stop(
                booking_id=int(preemption.booking_id), to=State.PREEMPTED, now=now, detail=detail
            ):
                count += 1
    return count


def _apply_starts(plan, snap: Snapshot, now: datetime) -> tuple[int, int]:
    started, skipped, done = 0, 0, set()
    for start in plan.starts:
        booking_id = int(start.booking_id)
        pending = snap.pending[booking_id]
        rows = [share_row(snap.devices[d], start) for d in start.device_ids]
        borrowed = " and ".join(start.borrowed_past)
        if start_planned(
            pending=pending, rows=rows, snap=snap, now=now, done=done, borrowed_past=borrowed
        ):
            done.add(booking_id)
            started += 1
        else:
            skipped += 1
    return started, skipped


def _store_plans(plan, snap: Snapshot, now: datetime) -> int:
    """Write each pending booking's planned start, position, reason and priority where changed."""
    started = {s.booking_id for s in plan.starts} | set(plan.never_met)
    changed = []
    for planned in plan.planned:
        if planned.booking_id in started:
            continue
        stored = snap.pending[int(planned.booking_id)]
        values = _plan_values(planned)
        if values[:4] != stored.plan_values[:4] or not _same_priority(
            stored.plan_values[4], values[4]
        ):
            changed.append((stored.pk, *values))
    _bulk_store(changed)
    if changed:
        events.queue_changed(changed=len(changed))
    return len(changed)


def _plan_values(planned) -> tuple:
    # Planned starts to the whole second, as epoch seconds (the snapshot reads them so).
    start = round(planned.start) if planned.start is not None else None
    p = planned.priority
    # Whole points, as the pages show them: an age that grows by a fraction each pass is not
    # a change worth a write. Written as PostgreSQL prints the jsonb (keys shortest first, then
    # in byte order), so an unchanged priority compares equal as text, with no JSON decoded.
    priority = (
        f'{{"age": {round(p.age)}, "qos": {round(p.qos)}, "size": {round(p.size)},'
        f' "total": {round(p.total)}, "fairshare": {round(p.fairshare)}}}'
    )
    return (start, planned.position, planned.reason[:24], planned.detail[:300], priority)


def _same_priority(stored: str | None, priority: str) -> bool:
    """Whether the stored priority (the database's JSON text) has these values."""
    # Any other spelling of the same values (SQLite keeps the text it was given) is decoded.
    return stored == priority or (stored is not None and json.loads(stored) == json.loads(priority))


_STORE_CHUNK = 1000


def _bulk_store(rows: list[tuple]) -> None:
    """Set-based UPDATEs from one JSON document of rows (jsonb_to_recordset), only on bookings
    still pending.

    One text parameter per statement whatever the number of rows, encoded by the json module's
    C encoder (six array parameters cost ~50 ms a thousand rows to quote client-side). Each
    chunk commits on its own: a person cancelling or extending a pending
    booking waits for one chunk at most, not for the whole queue's update.
    """
    if not rows:
        return
    if connection.vendor != "postgresql":
        _bulk_store_portable(rows)
        return
    table = Booking._meta.db_table
    sql = (
        f"UPDATE {table} AS b SET planned_start = to_timestamp(v.epoch),"
        " queue_position = v.position,"
        " pending_reason = v.reason, state_detail = v.detail, priority = v.priority::jsonb"
        " FROM json_to_recordset(%s::json) AS v(id bigint, epoch float8, position integer,"
        " reason text, detail text, priority text)"
        " WHERE b.id = v.id AND b.state = 'pending'"
    )
    names = ("id", "epoch", "position", "reason", "detail", "priority")
    for i in range(0, len(rows), _STORE_CHUNK):
        document = json.dumps(
            [dict(zip(names, row, strict=True)) for row in rows[i : i + _STORE_CHUNK]]
        )
        with transaction.atomic(durable=True), connection.cursor() as cursor:
            cursor.execute(sql, [document])


def _bulk_store_portable(rows: list[tuple]) -> None:
    # The embedded SQLite site is small: the ORM's bulk_update is fast enough there.
    bookings = [
        Booking(
            pk=pk,
            planned_start=None if start is None else from_epoch(start),
            queue_position=position,
            pending_reason=reason,
            state_detail=detail,
            priority=json.loads(priority),
        )
        for pk, start, position, reason, detail, priority in rows
    ]
    with transaction.atomic(durable=True):
        pending = set(
            Booking.objects.filter(pk__in=[b.pk for b in bookings], state=State.PENDING)
            .select_for_update()
            .values_list("pk", flat=True)
        )
        Booking.objects.bulk_update(
            [b for b in bookings if b.pk in pending],
            ["planned_start", "queue_position", "pending_reason", "state_detail", "priority"],
            batch_size=500,
        )
