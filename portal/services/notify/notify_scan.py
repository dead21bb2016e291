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
from portal.services.booking.quotas import QuotaAsk, quota_positions
from portal.services.core.clock import to_epoch
from portal.services.notify.arrays import tasks_told_alone
from portal.services.notify.delivery import deliveries_due
from portal.services.notify.notifications import deliveries_enqueue, notification_record
from scheduler import budget_nearly_used

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
        _record(b, Event.STARTING_SOON, f"starting_soon:{b.pk}:{int(to_epoch(b.start))}", now)
        for b in due.select_related("owner", "project")
    )


def _ending_soon(now: datetime) -> int:
    lead = timedelta(minutes=settings.NOTIFY_ENDING_SOON_MIN)
    due = (
        Booking.objects.filter(tasks_told_alone(), state=State.ACTIVE, allocations__live=True)
        .annotate(until=Max("allocations__end"))
        .filter(until__gt=now, until__lte=now + lead)
        .select_related("owner", "project")
    )
    return sum(
        _record(
            b,
            Event.ENDING_SOON,
            f"ending_soon:{b.pk}:{int(to_epoch(b.until))}",
            now,
            end=b.until.isoformat(),
        )
        for b in due
    )


def _queue_changes(now: datetime) -> int:
    """A queued request is told its place once planned, and again if its start moves a lot
    (a job array's task is not, unless its owner asked: its array was told once)."""
    threshold = timedelta(minutes=settings.NOTIFY_MOVED_THRESHOLD_MIN)
    planned = Booking.objects.filter(
        tasks_told_alone(), state=State.PENDING, planned_start__isnull=False
    )
    # The last queued/moved message of every waiting booking, in one query (the queue is long).
    told = dict(
        Notification.objects.filter(
            booking__state=State.PENDING, event__in=(Event.QUEUED, Event.MOVED)
        )
        .order_by("created", "id")
        .values_list("booking_id", "context")
    )
    count = 0
    for b in planned.select_related("owner", "project"):
        start = b.planned_start.isoformat()
        if b.pk not in told:
            count += _record(b, Event.QUEUED, f"queued:{b.pk}", now, planned_start=start)
            continue
        previous = parse_datetime(told[b.pk].get("planned_start") or start)
        if abs(b.planned_start - previous) > threshold:
            key = f"moved:{b.pk}:{int(to_epoch(b.planned_start))}"
            count += _record(
                b, Event.MOVED, key, now, planned_start=start, previous=previous.isoformat()
            )
    return count


def _budget(now: datetime) -> int:
    """Owners of live bookings whose GPU-hour budget (theirs in the project, or the project's)
    is NOTIFY_BUDGET_FRACTION used, read by the one quota position reader."""
    live = Booking.objects.filter(state__in=Booking.LIVE_STATES).select_related("owner", "project")
    first = {}
    for b in live.order_by("id"):
        first.setdefault((b.project_id, b.owner_id), b)
    if not first:
        return 0
    positions = quota_positions(now=now, asks={pair: QuotaAsk(*pair) for pair in first})
    count = 0
    for (project_id, owner_id), position in positions.items():
        side = next(
            (s for s in position.sides if budget_nearly_used(s, settings.NOTIFY_BUDGET_FRACTION)),
            None,
        )
        if side is None:
            continue
        limits = position.user_limits if side.scope == "user" else position.project_limits
        hours, budget = side.quota.gpu_hours_used, side.quota.gpu_hours_budget
        # Once per user, project and period.
        period = int(to_epoch(now) // (limits.budget_period_days * 86400))
        key = f"budget:{project_id}:{owner_id}:{period}"
        count += _record(
            first[(project_id, owner_id)], Event.BUDGET, key, now, used=round(hours, 1),
            budget=budget, percent=round(100 * hours / budget), scope=side.scope,
        )  # fmt: skip
    return count
