"""The allocation pass: ORM rows in, the pure scheduler's plan out, decisions written in one go.

The scheduler module decides; this service only translates. The same `scheduler.plan` runs in
the Celery worker, in the embedded in-process loop and in the trace replay.
"""

import logging
from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db import IntegrityError, transaction

from portal.models import Allocation, Booking, Gpu, MigInstance, Node
from portal.services import events, live
from portal.services.bookings import booking_transition
from portal.services.locking import lock_nodes, try_advisory_lock
from portal.services.quotas import EffectiveQuota, quota_effective, usage_current

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
        result = PassResult()
        result.finished = _finish_ended(now)
        result.started = _start_due_reservations(now)
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


def _start_due_reservations(now: datetime) -> int:
    due = list(
        Booking.objects.filter(state=State.PLANNED, start__lte=now).values_list("pk", flat=True)
    )
    count = 0
    for booking_id in due:
        if Booking.objects.filter(pk=booking_id, state=State.PLANNED).update(
            state=State.ACTIVE, started_at=now
        ):
            events.booking_changed(Booking(pk=booking_id), "started")
            count += 1
    return count


def scheduler_policy():
    """The allocator's policy from settings (weights, half-life, QOS levels, grace)."""
    import scheduler

    return scheduler.Policy(**settings.SCHEDULER_POLICY)


def _plan_queue(now: datetime, result: PassResult) -> None:
    import scheduler

    pending = list(
        Booking.objects.filter(state=State.PENDING)
        .select_related("owner", "project")
        .order_by("submitted_at", "id")
    )
    result.pending = len(pending)
    if not pending:
        return
    state, devices = _scheduler_state(now, pending)
    plan = scheduler.plan(state, scheduler_policy())
    lock_nodes(Node.objects.values_list("id", flat=True))
    _apply_preemptions(plan, now, result)
    by_id = {b.pk: b for b in pending}
    started = _apply_starts(plan, by_id, devices, now)
    result.started += started
    _store_plans(plan, by_id, now)


def _ts(value: datetime) -> float:
    return value.timestamp()


def _user_key(booking: Booking) -> str:
    # Quotas are per user within a project, so the allocator's "user" is the pair.
    return f"{booking.owner_id}:{booking.project_id}"


def _scheduler_state(now: datetime, pending: list[Booking]):
    import scheduler

    devices = _devices()
    allocations = _allocations(now)
    quotas_user: dict[str, scheduler.Quota] = {}
    quotas_project: dict[str, scheduler.Quota] = {}
    shares: dict[str, float] = {}
    for booking in pending:
        key = _user_key(booking)
        if key not in quotas_user:
            effective = quota_effective(project=booking.project, user=booking.owner)
            quotas_user[key] = _quota(effective, booking.project, booking.owner, now)
        project_key = str(booking.project_id)
        if project_key not in quotas_project:
            from portal.services.quotas import quota_project

            project_quota = quota_project(project=booking.project)
            quotas_project[project_key] = _quota(project_quota, booking.project, None, now)
            shares[project_key] = project_quota.shares
    state = scheduler.State(
        now=_ts(now),
        devices=tuple(d for d, _ in devices.values()),
        allocations=allocations,
        pending=tuple(_request(b) for b in pending),
        project_shares=shares,
        project_usage=_decayed_usage(now),
        user_quotas=quotas_user,
        project_quotas=quotas_project,
    )
    return state, devices


def _quota(effective: EffectiveQuota, project, user, now: datetime):
    import scheduler

    used = 0.0
    if effective.gpu_hours_budget is not None:
        used = usage_current(
            project=project, user=user, now=now, period_days=effective.budget_period_days
        ).gpu_hours_used
    return scheduler.Quota(
        max_gpus=effective.max_gpus,
        gpu_hours_budget=effective.gpu_hours_budget,
        gpu_hours_used=used,
    )


def _devices() -> dict[str, tuple]:
    """Scheduler devices keyed by id, with the (gpu_id, mig_id, fraction) to write allocations."""
    import scheduler
    from portal.services.telemetry_cache import latest_by_uuid

    readings = latest_by_uuid()
    devices: dict[str, tuple] = {}
    for gpu in Gpu.objects.select_related("node").filter(mig_mode=False):
        reading = readings.get(gpu.uuid, {})
        devices[f"gpu:{gpu.pk}"] = (
            scheduler.Device(
                id=f"gpu:{gpu.pk}",
                node=gpu.node.hostname,
                model=gpu.model,
                fraction=1.0,
                node_state=gpu.node.state,
                temperature_c=reading.get("temperature_c"),
                utilization=reading.get("utilization_gpu"),
            ),
            (gpu.pk, None, 1.0),
        )
    for mig in MigInstance.objects.select_related("gpu__node").filter(gpu__mig_mode=True):
        devices[f"mig:{mig.pk}"] = (
            scheduler.Device(
                id=f"mig:{mig.pk}",
                node=mig.gpu.node.hostname,
                model=mig.gpu.model,
                profile=mig.profile,
                fraction=mig.fraction,
                node_state=mig.gpu.node.state,
                parent=f"gpu:{mig.gpu_id}",
            ),
            (mig.gpu_id, mig.pk, mig.fraction),
        )
    return devices


def _device_id(allocation: Allocation) -> str:
    return (
        f"mig:{allocation.mig_instance_id}"
        if allocation.mig_instance_id
        else f"gpu:{allocation.gpu_id}"
    )


def _allocations(now: datetime) -> tuple:
    import scheduler

    grouped: dict[int, list[Allocation]] = defaultdict(list)
    live_rows = Allocation.objects.filter(live=True, end__gt=now).select_related("booking")
    for allocation in live_rows:
        grouped[allocation.booking_id].append(allocation)
    out = []
    for rows in grouped.values():
        booking = rows[0].booking
        out.append(
            scheduler.Allocation(
                booking_id=str(booking.pk),
                device_ids=tuple(sorted(_device_id(a) for a in rows)),
                start=_ts(min(a.start for a in rows)),
                end=_ts(max(a.end for a in rows)),
                user=_user_key(booking),
                project=str(booking.project_id),
                qos=booking.qos,
                preemptible=booking.preemptible,
                running=booking.state == State.ACTIVE,
            )
        )
    return tuple(sorted(out, key=lambda a: a.booking_id))


def _decayed_usage(now: datetime) -> dict[str, float]:
    import scheduler

    half_life = settings.SCHEDULER_POLICY.get("fairshare_half_life_s", 7 * 86400)
    since = now - timedelta(seconds=4 * half_life)
    records = [
        (str(project_id), _ts(start), _ts(min(end, now)), fraction)
        for project_id, start, end, fraction in Allocation.objects.filter(
            start__lt=now, end__gt=since
        ).values_list("booking__project_id", "start", "end", "fraction")
    ]
    return scheduler.decay_usage(records, _ts(now), half_life)


def _request(booking: Booking):
    import scheduler

    return scheduler.Request(
        booking_id=str(booking.pk),
        user=_user_key(booking),
        project=str(booking.project_id),
        submit_time=_ts(booking.submitted_at),
        duration_s=float(booking.duration_s),
        gpus=booking.gpus or 1,
        mig_profile=booking.mig_profile or None,
        gpu_model=booking.gpu_model or None,
        qos=booking.qos,
        preemptible=booking.preemptible,
    )


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
        except IntegrityError:
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
        transaction.on_commit(lambda: live.group_send(live.QUEUE_GROUP, {"type": "queue.changed"}))
