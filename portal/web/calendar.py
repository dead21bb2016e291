"""The week timeline: which device is held when, and where queued requests are planned to start."""

from dataclasses import dataclass
from datetime import date, datetime, timedelta

from portal.models import Allocation, Booking
from portal.services.bookings import visible_bookings

WEEK = timedelta(days=7)
# The page links the weeks either side of the one shown: keep all three inside what dates can hold.
_FIRST_DAY = date.min + 2 * WEEK
_LAST_DAY = date.max - 2 * WEEK


@dataclass(frozen=True)
class Bar:
    """A booking's span on one device row, in percent of the week."""

    left: float
    width: float
    label: str
    state: str
    title: str
    booking_id: int
    visible: bool


def week_start(value: str, today: date) -> date:
    """The Monday of the week holding `value` (YYYY-MM-DD), or of today's week."""
    try:
        day = date.fromisoformat(value)
    except (TypeError, ValueError):
        day = today
    if not _FIRST_DAY <= day <= _LAST_DAY:
        day = today
    return day - timedelta(days=day.weekday())


def geometry(start: datetime, end: datetime, since: datetime, until: datetime) -> tuple:
    """(left %, width %) of [start, end) clipped to [since, until); None if it lies outside."""
    span = (until - since).total_seconds()
    left = max(start, since)
    right = min(end, until)
    if right <= left:
        return None
    return (
        round(100 * (left - since).total_seconds() / span, 3),
        round(100 * (right - left).total_seconds() / span, 3),
    )


def week_bars(*, user, since: datetime, until: datetime) -> dict[str, list[Bar]]:
    """Bars per device UUID for live allocations and past ones overlapping the week."""
    allocations = Allocation.objects.filter(start__lt=until, end__gt=since).select_related(
        "booking__owner", "gpu", "mig_instance"
    )
    allocations = [a for a in allocations if a.live or a.booking.state != Booking.State.CANCELLED]
    mine = set(
        visible_bookings(user)
        .filter(pk__in={a.booking_id for a in allocations})
        .values_list("pk", flat=True)
    )
    bars: dict[str, list[Bar]] = {}
    for a in allocations:
        place = geometry(a.start, a.end, since, until)
        if place is None:
            continue
        booking = a.booking
        bars.setdefault(a.device_uuid, []).append(
            Bar(
                left=place[0],
                width=place[1],
                label=f"#{booking.pk} {booking.owner.username}",
                state=booking.state,
                title=f"Booking {booking.pk} by {booking.owner.username}, {booking.state}, "
                f"{a.start:%a %d %b %H:%M} to {a.end:%a %d %b %H:%M} UTC",
                booking_id=booking.pk,
                visible=booking.pk in mine,
            )
        )
    return bars


def planned_starts(*, user, since: datetime, until: datetime) -> list[dict]:
    """Queued requests with a planned start this week, as markers on the queue lane."""
    pending = (
        Booking.objects.filter(
            state=Booking.State.PENDING, planned_start__gte=since, planned_start__lt=until
        )
        .select_related("owner")
        .order_by("planned_start", "id")
    )
    span = (until - since).total_seconds()
    return [
        {
            "left": round(100 * (b.planned_start - since).total_seconds() / span, 3),
            "label": f"#{b.pk} {b.describe_request()}",
            "title": f"Booking {b.pk} by {b.owner.username} ({b.describe_request()}) "
            f"planned to start {b.planned_start:%a %d %b %H:%M} UTC",
            "mine": b.owner_id == user.pk,
            "booking_id": b.pk,
        }
        for b in pending
    ]


def day_slots(since: datetime, now: datetime) -> list[dict]:
    """The week's seven days, each with a free-slot window to prefill Book with."""
    days = []
    for i in range(7):
        day_start = since + timedelta(days=i)
        start = max(day_start + timedelta(hours=9), _next_hour(now))
        days.append(
            {
                "start": day_start,
                "slot_start": start,
                "slot_end": start + timedelta(hours=4),
                "bookable": start < day_start + timedelta(days=1),
            }
        )
    return days


def _next_hour(now: datetime) -> datetime:
    return now.replace(minute=0, second=0, microsecond=0) + timedelta(hours=1)
