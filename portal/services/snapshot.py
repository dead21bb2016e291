"""The ORM as the pure scheduler sees it: one snapshot of devices, allocations, queue and quotas.

Used by the allocation pass and by the start estimate, so both judge a booking the same way.
"""

from collections import defaultdict
from dataclasses import replace
from datetime import datetime, timedelta

from django.conf import settings

import scheduler
from portal.models import Allocation, Booking, Gpu, MigInstance
from portal.services.quotas import EffectiveQuota, quota_effective, quota_project, usage_current
from portal.services.telemetry_cache import latest_by_uuid

State = Booking.State


def scheduler_policy():
    """The allocator's policy from settings (weights, half-life, QOS levels, grace)."""
    return scheduler.Policy(**settings.SCHEDULER_POLICY)


def _ts(value: datetime) -> float:
    return value.timestamp()


def _user_key(booking: Booking) -> str:
    # Quotas are per user within a project, so the allocator's "user" is the pair.
    return f"{booking.owner.username}@{booking.project.slug}"


def snapshot_state(now: datetime, pending: list[Booking]):
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
        project_key = booking.project.slug
        if project_key not in quotas_project:
            project_quota = quota_project(project=booking.project)
            quotas_project[project_key] = _quota(project_quota, booking.project, None, now)
            shares[project_key] = project_quota.shares
    requests = tuple(_request(b) for b in pending)
    recent = _recent_runs(scheduler_policy().predict_last, now)
    if recent:
        # Run-time prediction (docs/scheduling.md): plan with the predicted run, the booking's
        # own end stays the hard end; a running booking past its prediction is planned to its end.
        requests = tuple(
            replace(r, duration_s=scheduler.predict_run(recent.get(r.user, ()), r.duration_s))
            for r in requests
        )
        allocations = tuple(
            _predicted_end(a, recent.get(a.user, ()), _ts(now)) for a in allocations
        )
    state = scheduler.State(
        now=_ts(now),
        devices=tuple(d for d, _ in devices.values()),
        allocations=allocations,
        pending=requests,
        project_shares=shares,
        project_usage=_decayed_usage(now),
        user_quotas=quotas_user,
        project_quotas=quotas_project,
    )
    return state, devices


def _quota(effective: EffectiveQuota, project, user, now: datetime):
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
    gpus = list(Gpu.objects.select_related("node").filter(mig_mode=False))
    migs = list(MigInstance.objects.select_related("gpu__node").filter(gpu__mig_mode=True))
    readings = latest_by_uuid([g.uuid for g in gpus])
    devices: dict[str, tuple] = {}
    for gpu in gpus:
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
    for mig in migs:
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
    grouped: dict[int, list[Allocation]] = defaultdict(list)
    live_rows = Allocation.objects.filter(live=True, end__gt=now).select_related(
        "booking__owner", "booking__project"
    )
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
                project=booking.project.slug,
                qos=booking.qos,
                preemptible=booking.preemptible,
                running=booking.state == State.ACTIVE,
            )
        )
    return tuple(sorted(out, key=lambda a: a.booking_id))


def _recent_runs(last: int, now: datetime) -> dict[str, list[float]]:
    """Run seconds of each user's (user@project) ``last`` latest finished bookings."""
    if not last:
        return {}
    runs: dict[str, list[float]] = defaultdict(list)
    finished = (
        Booking.objects.filter(state=State.FINISHED, started_at__isnull=False, ended_at__lte=now)
        .order_by("-ended_at")
        .values_list("owner__username", "project__slug", "started_at", "ended_at")[:10_000]
    )
    for username, project, started, ended in finished:
        key = f"{username}@{project}"
        if len(runs[key]) < last:
            runs[key].append((ended - started).total_seconds())
    return runs


def _predicted_end(alloc, recent: list[float], now: float):
    if not alloc.running or not recent:
        return alloc
    end = alloc.start + scheduler.predict_run(recent, alloc.end - alloc.start)
    return replace(alloc, end=end) if end > now else alloc


def _decayed_usage(now: datetime) -> dict[str, float]:
    half_life = scheduler_policy().fairshare_half_life_s
    since = now - timedelta(seconds=4 * half_life)
    records = [
        (project, _ts(start), _ts(min(end, now)), fraction)
        for project, start, end, fraction in Allocation.objects.filter(
            start__lt=now, end__gt=since
        ).values_list("booking__project__slug", "start", "end", "fraction")
    ]
    return scheduler.decay_usage(records, _ts(now), half_life)


def _request(booking: Booking):
    return scheduler.Request(
        booking_id=str(booking.pk),
        user=_user_key(booking),
        project=booking.project.slug,
        submit_time=_ts(booking.submitted_at),
        duration_s=float(booking.duration_s),
        gpus=booking.gpus or 1,
        mig_profile=booking.mig_profile or None,
        gpu_model=booking.gpu_model or None,
        qos=booking.qos,
        preemptible=booking.preemptible,
    )
