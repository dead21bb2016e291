"""The calendar's timeline, a day or a week: which device is held when, which free slots can be
booked, and where queued requests are planned to start."""

from dataclasses import dataclass
from datetime import date, datetime, time, timedelta

from portal.models import Allocation, Booking, MaintenanceWindow
from portal.services.booking.selectors import visible_bookings
from portal.services.inventory import selectors as inventory
from portal.services.inventory.windows import window_nodes

WEEK = timedelta(days=7)
DAY = timedelta(days=1)
# view -> (span shown, length of one bookable slot, hours between labelled ticks)
VIEWS = {"week": (WEEK, timedelta(hours=4), 6), "day": (DAY, timedelta(hours=1), 1)}
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


@dataclass(frozen=True)
class Window:
    """What one calendar page shows: a day or a week from `since`, cut into bookable slots."""

    view: str
    first_day: date
    since: datetime
    until: datetime
    slot: timedelta
    tick_hours: int

    @property
    def previous(self) -> date:
        return self.first_day - (self.until - self.since)

    @property
    def next(self) -> date:
        return self.first_day + (self.until - self.since)


def calendar_window(*, view: str, value: str, now: datetime) -> Window:
    """The day (view "day") or the Monday-to-Sunday week (any other view) holding `value`
    (YYYY-MM-DD), or holding today when `value` is missing or out of range."""
    view = view if view in VIEWS else "week"
    day = _day(value, now.date())
    if view == "week":
        day = week_start(day.isoformat(), now.date())
    span, slot, tick_hours = VIEWS[view]
    since = datetime.combine(day, time.min, tzinfo=now.tzinfo)
    return Window(view, day, since, since + span, slot, tick_hours)


def _day(value: str, today: date) -> date:
    try:
        day = date.fromisoformat(value)
    except (TypeError, ValueError):
        return today
    return day if _FIRST_DAY <= day <= _LAST_DAY else today


def week_start(value: str, today: date) -> date:
    """The Monday of the week holding `value` (YYYY-MM-DD), or of today's week."""
    day = _day(value, today)
    return day - timedelta(days=day.weekday())


def ticks(window: Window) -> list[dict]:
    """Labelled marks along the top: each day (a week) and every `tick_hours` hours."""
    marks = []
    step = timedelta(hours=window.tick_hours)
    moment = window.since
    while moment < window.until:
        marks.append(
            {
                "left": geometry(moment, moment + step, window.since, window.until)[0],
                "moment": moment,
                "day_start": moment.hour == 0,
            }
        )
        moment += step
    return marks


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
        "booking__owner", "booking__project", "gpu", "mig_instance"
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
                label=f"#{booking.pk} {booking.owner.username} · {booking.project.slug}",
                state=booking.state,
                title=f"Booking {booking.pk} by {booking.owner.username} ({booking.project.slug}), "
                f"{booking.state}, "
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


@dataclass(frozen=True)
class Slot:
    """A free stretch of one device that can be booked: in the future, on an up node, held by
    no live allocation."""

    left: float
    width: float
    start: datetime
    end: datetime


def free_slots(
    *, window: Window, now: datetime, held: list[tuple[datetime, datetime]], bookable: bool
) -> list[Slot]:
    """The window's slots from `now` on (the one under way from the next whole hour) that
    overlap none of the `held` spans."""
    if not bookable:
        return []
    # The slot under way is offered from the next whole hour, if that leaves any of it.
    next_hour = now.replace(minute=0, second=0, microsecond=0) + timedelta(hours=1)
    slots = []
    edge = window.since
    while edge < window.until:
        start, end = edge, edge + window.slot
        edge = end
        if start < now:
            start = next_hour
        if start < end and not any(s < end and start < e for s, e in held):
            left, width = geometry(start, end, window.since, window.until)
            slots.append(Slot(left, width, start, end))
    return slots


def held_spans(*, since: datetime, until: datetime) -> dict[str, list[tuple[datetime, datetime]]]:
    """Live allocations overlapping [since, until) per device UUID. A whole GPU's allocation also
    holds every MIG slice of it, under each slice's UUID."""
    rows = list(
        Allocation.objects.filter(live=True, start__lt=until, end__gt=since).values_list(
            "gpu__uuid", "mig_instance__uuid", "start", "end"
        )
    )
    slices: dict[str, list[str]] = {}
    # Only bookable slices have a row on the calendar.
    for gpu_uuid, mig_uuid in (
        inventory.mig_instances_bookable()
        .filter(gpu__uuid__in={r[0] for r in rows if r[1] is None})
        .values_list("gpu__uuid", "uuid")
    ):
        slices.setdefault(gpu_uuid, []).append(mig_uuid)
    spans: dict[str, list[tuple[datetime, datetime]]] = {}
    for gpu_uuid, mig_uuid, start, end in rows:
        for uuid in [mig_uuid] if mig_uuid else [gpu_uuid, *slices.get(gpu_uuid, [])]:
            spans.setdefault(uuid, []).append((start, end))
    return spans


@dataclass(frozen=True)
class MaintenanceBar:
    """A maintenance window's span on the rows of its nodes, in percent of the view."""

    left: float
    width: float
    title: str
    window_id: int


def maintenance_bars(*, since: datetime, until: datetime) -> dict[str, list[MaintenanceBar]]:
    """Maintenance windows overlapping [since, until) per node host name."""
    bars: dict[str, list[MaintenanceBar]] = {}
    windows = MaintenanceWindow.objects.filter(start__lt=until, end__gt=since).order_by("start")
    for window in windows.prefetch_related("nodes"):
        left, width = geometry(window.start, window.end, since, until)
        title = (
            f"Maintenance window {window.pk}: {window.reason}, "
            f"{window.start:%a %d %b %H:%M} to {window.end:%a %d %b %H:%M} UTC"
        )
        for node in window_nodes(window):
            bars.setdefault(node.hostname, []).append(MaintenanceBar(left, width, title, window.pk))
    return bars


def maintenance_spans(*, since: datetime, until: datetime) -> dict[str, list[tuple]]:
    """The same windows as (start, end) spans per node: no free slot is offered in them."""
    spans: dict[str, list[tuple]] = {}
    windows = MaintenanceWindow.objects.filter(start__lt=until, end__gt=since).order_by("start")
    for window in windows.prefetch_related("nodes"):
        for node in window_nodes(window):
            spans.setdefault(node.hostname, []).append((window.start, window.end))
    return spans
