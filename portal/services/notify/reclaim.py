"""Idle reclaim: warn a booking whose devices sit idle, release it if nobody keeps it.

Site policy (IDLE_RECLAIM_ENABLED, off by default), thresholds per site and per project. A
booking is idle when, over the last IDLE_MINUTES, every device it holds averaged under
IDLE_UTIL_THRESHOLD % utilization (a mean, so one noisy reading does not keep a forgotten
booking alive) and no process of its owner held GPU memory. The window is the booking's own:
one whose current run is younger than IDLE_MINUTES is never idle, and telemetry from before
it started (the device idling for someone else, or for nobody) never counts. MIG slices,
for which NVML reports no utilization, count as idle when their memory stayed under
IDLE_MEMORY_MIB. A warning carries a 'keep it' link; after IDLE_GRACE_MINUTES with no keep and
no activity the booking is released (the next bookings move up) and its owner told. Every
warning and its outcome is an IdleReclaim row.
"""

from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import Avg, Count, Max, Min

from portal.errors import InvalidState
from portal.models import (
    Allocation,
    Booking,
    Event,
    IdleReclaim,
    ProcessUsage,
    ProjectNotificationSettings,
    Sample,
)
from portal.services.booking.bookings import booking_reclaim_release
from portal.services.booking.events import caused_by
from portal.services.notify.notifications import notification_record


@dataclass(frozen=True)
class IdlePolicy:
    """The idle thresholds that apply to one project."""

    util_threshold: float
    minutes: int
    grace_minutes: int


def _policies(project_ids: set[int]) -> dict[int, IdlePolicy]:
    """Each project's thresholds (the site's, with the project's overrides where it set them),
    the overrides read in one query."""
    configs = {
        c.project_id: c
        for c in ProjectNotificationSettings.objects.filter(project_id__in=project_ids)
    }

    def policy(config) -> IdlePolicy:
        def pick(name: str, site):
            value = getattr(config, name, None)
            return site if value is None else value

        return IdlePolicy(
            util_threshold=pick("idle_util_threshold", settings.IDLE_UTIL_THRESHOLD),
            minutes=pick("idle_minutes", settings.IDLE_MINUTES),
            grace_minutes=pick("idle_grace_minutes", settings.IDLE_GRACE_MINUTES),
        )

    return {project_id: policy(configs.get(project_id)) for project_id in project_ids}


def idle_reclaim_scan(*, now: datetime) -> dict:
    """One look at every active booking: warn the newly idle, release the unkept. Counts."""
    counts = {"warned": 0, "released": 0, "busy": 0}
    if not settings.IDLE_RECLAIM_ENABLED:
        return counts
    active = list(
        Booking.objects.filter(state=Booking.State.ACTIVE).values_list(
            "pk", "project_id", "started_at", "requeued_at"
        )
    )
    policies = _policies({row[1] for row in active})
    # Open warnings of every active booking, in one query rather than one per booking.
    warnings = {
        w.booking_id: w
        for w in IdleReclaim.objects.filter(
            booking__state=Booking.State.ACTIVE, state=IdleReclaim.State.WARNED
        )
    }
    for booking_id, project_id, started_at, requeued_at in active:
        run_start = _run_start(started_at, requeued_at)
        if run_start is None:
            continue
        policy = policies[project_id]
        outcome = _review(booking_id, policy, warnings.get(booking_id), run_start, now)
        if outcome:
            counts[outcome] += 1
    return counts


def _run_start(started_at: datetime | None, requeued_at: datetime | None) -> datetime | None:
    """When the booking's current run began: a requeued booking's earlier run is not its own."""
    times = [t for t in (started_at, requeued_at) if t is not None]
    return max(times) if times else None


def _review(
    booking_id: int,
    policy: IdlePolicy,
    open_warning: IdleReclaim | None,
    run_start: datetime,
    now: datetime,
) -> str | None:
    if open_warning is None:
        since = now - timedelta(minutes=policy.minutes)
        # The window is the booking's own: a device idle before the booking started on it says
        # nothing about the booking, so one younger than the window is never idle.
        if since < run_start:
            return None
        recently_closed = IdleReclaim.objects.filter(booking_id=booking_id, closed_at__gt=since)
        if recently_closed.exists() or not booking_idle(
            booking_id=booking_id, since=since, threshold=policy.util_threshold
        ):
            return None
        return "warned" if _warn(booking_id, policy, now) else None
    if open_warning.warned_at < run_start:
        # Warned in an earlier run (then requeued): that run ended, so the warning is void; the
        # new run is judged on its own window from the next scan on.
        _close(open_warning.pk, IdleReclaim.State.BUSY, now)
        return None
    still_idle = booking_idle(
        booking_id=booking_id, since=open_warning.warned_at, threshold=policy.util_threshold
    )
    if not still_idle:
        _close(open_warning.pk, IdleReclaim.State.BUSY, now)
        return "busy"
    if now < open_warning.warned_at + timedelta(minutes=policy.grace_minutes):
        return None
    return "released" if booking_reclaim(booking_id=booking_id, now=now) else None


def booking_idle(*, booking_id: int, since: datetime, threshold: float) -> bool:
    """Whether every device of the booking stayed idle since `since` (telemetry covers it)."""
    uuids = _device_uuids(booking_id)
    if not uuids:
        return False
    owner_processes = ProcessUsage.objects.filter(
        booking_id=booking_id, foreign=False, last_seen__gt=since, peak_memory_mib__gt=0
    )
    if owner_processes.exists():
        return False
    seen = (
        Sample.objects.filter(uuid__in=uuids, time__gte=since)
        .values("uuid")
        .annotate(
            n=Count("id"),
            first=Min("time"),
            util=Avg("utilization_gpu"),
            memory=Max("memory_used_mib"),
        )
    )
    rows = {row["uuid"]: row for row in seen}
    # Telemetry must cover the whole window: a device not heard from is not known to be idle.
    cover = since + timedelta(minutes=2)
    return len(rows) == len(uuids) and all(
        row["first"] <= cover and _row_idle(row, threshold) for row in rows.values()
    )


def _row_idle(row: dict, threshold: float) -> bool:
    if row["util"] is not None:
        return row["util"] < threshold
    return (row["memory"] or 0) <= settings.IDLE_MEMORY_MIB


def _device_uuids(booking_id: int) -> list[str]:
    rows = Allocation.objects.filter(booking_id=booking_id, live=True).values_list(
        "gpu__uuid", "mig_instance__uuid"
    )
    return [mig or gpu for gpu, mig in rows]


def _warn(booking_id: int, policy: IdlePolicy, now: datetime) -> bool:
    booking = Booking.objects.select_related("owner", "project").get(pk=booking_id)
    release_at = now + timedelta(minutes=policy.grace_minutes)
    try:
        with transaction.atomic():
            IdleReclaim.objects.create(
                booking=booking,
                warned_at=now,
                detail=f"under {policy.util_threshold:g}% for {policy.minutes} min",
            )
            notification_record(
                event=Event.IDLE,
                now=now,
                booking=booking,
                context={
                    "threshold": policy.util_threshold,
                    "minutes": policy.minutes,
                    "release_at": release_at.isoformat(),
                },
            )
    except IntegrityError:
        return False  # another scan warned it a moment ago
    return True


def _close(reclaim_id: int, state: str, now: datetime) -> bool:
    return bool(
        IdleReclaim.objects.filter(pk=reclaim_id, state=IdleReclaim.State.WARNED).update(
            state=state, closed_at=now
        )
    )


def idle_keep(*, booking_id: int, now: datetime) -> None:
    """The owner keeps an idle booking: no release for this warning, none before a new one."""
    warning = IdleReclaim.objects.filter(
        booking_id=booking_id, state=IdleReclaim.State.WARNED
    ).first()
    if warning is None or not _close(warning.pk, IdleReclaim.State.KEPT, now):
        raise InvalidState(f"Booking {booking_id} has no idle warning open; nothing to keep.")


def booking_reclaim(*, booking_id: int, now: datetime) -> bool:
    """Release an idle booking whose warning nobody answered; False if it ended or was kept.

    The warning is closed as released first (compare-and-set), so a 'keep' racing in either
    wins before it or finds nothing to keep. The release is the owner's ordinary one: the
    allocator runs and the next bookings move up; the owner hears 'released for idleness'.
    """
    warning = IdleReclaim.objects.filter(
        booking_id=booking_id, state=IdleReclaim.State.WARNED
    ).first()
    if warning is None or not _close(warning.pk, IdleReclaim.State.RELEASED, now):
        return False
    try:
        with caused_by("reclaim"):  # the owner is told it was released for idleness
            booking_reclaim_release(booking_id=booking_id, now=now)
    except InvalidState:
        return False
    return True
