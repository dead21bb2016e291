"""The allocation pass: ORM rows in, the pure scheduler's plan out, decisions written in one go.

The scheduler module decides; this service only translates. The same `scheduler.plan` runs in
the Celery worker, in the embedded in-process loop and in the trace replay.
"""

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db import IntegrityError, OperationalError, transaction

import scheduler
from portal.models import Allocation, Booking, Node
from portal.services import events, live
from portal.services.bookings import booking_transition
from portal.services.locking import is_allocation_clash, lock_nodes, try_advisory_lock
from portal.services.reservations import reservations_start_due
from portal.services.snapshot import scheduler_policy, snapshot_state

log = logging.getLogger(__name__)
State = Booking.State
PASS_LOCK_KEY = 0x6770755F70617373  # "gpu_pass": one allocation pass at a time, cluster-wide


@dataclass
class PassResult:
    """What one pass did, for logs, tests and the benchmark."""

    ran: bool = True
    started: int = 0
    finished: int = 0
    preempted: int = 0
    pending: int = 0


def allocation_pass(*, now: datetime) -> PassResult:
    """Run one pass: end what is over, start due reservations, plan and start the queue."""
    with transaction.atomic(durable=True):
        if not try_advisory_lock(PASS_LOCK_KEY):
            return PassResult(ran=False)
        # Lock order everywhere: nodes (sorted), then bookings. Taking the nodes first also keeps
        # reservations from landing between the snapshot and the writes.
        lock_nodes(Node.objects.values_list("id", flat=True))
        result = PassResult()
        result.finished = _finish_ended(now)
        result.started = reservations_start_due(now=now)
        _plan_queue(now, result)
    return result


def _finish_ended(now: datetime) -> int:
    ended = (
        Booking.objects.filter(state=State.ACTIVE)
        .exclude(allocations__live=True, allocations__end__gt=now)
        .values_list("pk", flat=True)
    )
    count = 0
    for booking_id in list(ended):
        if booking_transition(
            booking_id,
            from_states=(State.ACTIVE,),
            to=State.FINISHED,
            now=now,
            detail="reached its end time",
        ):
            events.booking_changed(Booking(pk=booking_id), "finished")
            count += 1
    return count


def _plan_queue(now: datetime, result: PassResult) -> None:
    pending = list(
        Booking.objects.filter(state=State.PENDING)
        .select_related("owner", "project")
        .order_by("submitted_at", "id")
    )
    result.pending = len(pending)
    if not pending:
        return
    state, devices = snapshot_state(now, pending)
    plan = scheduler.plan(state, scheduler_policy())
    _apply_preemptions(plan, now, result)
    by_id = {b.pk: b for b in pending}
    started = _apply_starts(plan, by_id, devices, now)
    result.started += started
    _store_plans(plan, by_id, now)


def _apply_preemptions(plan, now: datetime, result: PassResult) -> None:
    for preemption in plan.preemptions:
        booking = Booking.objects.filter(pk=int(preemption.booking_id)).first()
        if booking is None:
            continue
        detail = f"preempted for booking {preemption.for_booking_id}"
        if not booking_transition(
            booking.pk, from_states=(State.ACTIVE,), to=State.PREEMPTED, now=now, detail=detail
        ):
            continue
        result.preempted += 1
        if booking.command:
            # A batch job goes back to the queue, keeping its submit time (and so its age).
            Booking.objects.filter(pk=booking.pk).update(
                state=State.PENDING, ended_at=None, state_detail=detail + "; requeued"
            )
            events.booking_changed(booking, "requeued")
        else:
            events.booking_changed(booking, "preempted")


def _apply_starts(plan, by_id: dict[int, Booking], devices: dict[str, tuple], now: datetime) -> int:
    started = 0
    for start in plan.starts:
        booking = by_id[int(start.booking_id)]
        end = now + timedelta(seconds=booking.duration_s)
        rows = [devices[d][1] for d in start.device_ids]
        try:
            with transaction.atomic():
                if not Booking.objects.filter(pk=booking.pk, state=State.PENDING).update(
                    state=State.ACTIVE,
                    started_at=now,
                    planned_start=now,
                    queue_position=None,
                    pending_reason="",
                ):
                    continue
                Allocation.objects.bulk_create(
                    Allocation(
                        booking=booking, gpu_id=g, mig_instance_id=m, start=now, end=end, fraction=f
                    )
                    for g, m, f in rows
                )
        except (IntegrityError, OperationalError) as exc:
            if not is_allocation_clash(exc):
                raise
            log.warning(
                "booking %s: devices %s taken meanwhile; retried next pass",
                booking.pk,
                start.device_ids,
            )
            continue
        events.booking_changed(booking, "started")
        started += 1
    return started


def _store_plans(plan, by_id: dict[int, Booking], now: datetime) -> None:
    started = {s.booking_id for s in plan.starts}
    changed = []
    for planned in plan.planned:
        if planned.booking_id in started:
            continue
        booking = by_id[int(planned.booking_id)]
        booking.planned_start = (
            datetime.fromtimestamp(planned.start, tz=now.tzinfo) if planned.start else None
        )
        booking.queue_position = planned.position
        booking.pending_reason = planned.reason[:16]
        booking.state_detail = planned.detail[:300]
        p = planned.priority
        booking.priority = {
            "total": p.total,
            "age": p.age,
            "fairshare": p.fairshare,
            "size": p.size,
            "qos": p.qos,
        }
        changed.append(booking)
    Booking.objects.bulk_update(
        changed,
        ["planned_start", "queue_position", "pending_reason", "state_detail", "priority"],
        batch_size=500,
    )
    if changed:
        transaction.on_commit(
            lambda: live.group_send(live.QUEUE_GROUP, {"type": "queue.changed"}), robust=True
        )
