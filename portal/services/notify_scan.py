"""The periodic notifications: found by looking, not caused by one change.

Each is recorded under a key naming the occurrence (the booking and the time it is about), so a
scan that runs twice, or two scans racing, record it once; a booking extended gets a new
'ending soon' for its new end.
"""

from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Max
from django.utils.dateparse import parse_datetime

from portal.models import Booking, Event, Notification
from portal.services.delivery import deliveries_due
from portal.services.notifications import deliveries_enqueue, notification_record
from portal.services.quotas import quota_effective, usage_current

State = Booking.State


def notifications_scan(*, now: datetime) -> dict:
    """One look: record what is due and send deliveries left pending or due a retry. Counts."""
    counts = {
        "starting_soon": _starting_soon(now),
        "ending_soon": _ending_soon(now),
        "queued": _queue_changes(now),
        "budget": _budget(now),
    }
    waiting = deliveries_due(now=now)
    deliveries_enqueue(waiting)
    counts["resent"] = len(waiting)
    return counts


def _record(booking: Booking, event: str, key: str, now: datetime, **context) -> int:
    with transaction.atomic():
        return int(
            notification_record(event=event, now=now, booking=booking, key=key, context=context) > 0
        )


def _starting_soon(now: datetime) -> int:
    lead = timedelta(minutes=settings.NOTIFY_STARTING_SOON_MIN)
    due = Booking.objects.filter(state=State.PLANNED, start__gt=now, start__lte=now + lead)
    return sum(
        _record(b, Event.STARTING_SOON, f"starting_soon:{b.pk}:{int(b.start.timestamp())}", now)
        for b in due.select_related("owner", "project")
    )


def _ending_soon(now: datetime) -> int:
    lead = timedelta(minutes=settings.NOTIFY_ENDING_SOON_MIN)
    due = (
        Booking.objects.filter(state=State.ACTIVE, allocations__live=True)
        .annotate(until=Max("allocations__end"))
        .filter(until__gt=now, until__lte=now + lead)
        .select_related("owner", "project")
    )
    return sum(
        _record(
            b,
            Event.ENDING_SOON,
            f"ending_soon:{b.pk}:{int(b.until.timestamp())}",
            now,
            end=b.until.isoformat(),
        )
        for b in due
    )


def _queue_changes(now: datetime) -> int:
    """A queued request is told its place once planned, and again if its start moves a lot."""
    threshold = timedelta(minutes=settings.NOTIFY_MOVED_THRESHOLD_MIN)
    planned = Booking.objects.filter(state=State.PENDING, planned_start__isnull=False)
    count = 0
    for b in planned.select_related("owner", "project"):
        last = (
            Notification.objects.filter(booking=b, event__in=(Event.QUEUED, Event.MOVED))
            .order_by("-created", "-id")
            .first()
        )
        start = b.planned_start.isoformat()
        if last is None:
            count += _record(b, Event.QUEUED, f"queued:{b.pk}", now, planned_start=start)
            continue
        previous = parse_datetime(last.context.get("planned_start") or start)
        if abs(b.planned_start - previous) > threshold:
            key = f"moved:{b.pk}:{int(b.planned_start.timestamp())}"
            count += _record(
                b, Event.MOVED, key, now, planned_start=start, previous=previous.isoformat()
            )
    return count


def _budget(now: datetime) -> int:
    """Owners of live bookings who used NOTIFY_BUDGET_FRACTION of their GPU-hour budget."""
    count = 0
    seen = set()
    live = Booking.objects.filter(state__in=Booking.LIVE_STATES).select_related("owner", "project")
    for b in live.order_by("id"):
        if (b.owner_id, b.project_id) in seen:
            continue
        seen.add((b.owner_id, b.project_id))
        quota = quota_effective(project=b.project, user=b.owner)
        if not quota.gpu_hours_budget:
            continue
        used = usage_current(
            project=b.project, user=b.owner, now=now, period_days=quota.budget_period_days
        ).gpu_hours_used
        if used < settings.NOTIFY_BUDGET_FRACTION * quota.gpu_hours_budget:
            continue
        # Once per user, project and period.
        period = int(now.timestamp() // (quota.budget_period_days * 86400))
        key = f"budget:{b.project_id}:{b.owner_id}:{period}"
        percent = round(100 * used / quota.gpu_hours_budget)
        count += _record(
            b, Event.BUDGET, key, now, used=round(used, 1), budget=quota.gpu_hours_budget,
            percent=percent,
        )  # fmt: skip
    return count
