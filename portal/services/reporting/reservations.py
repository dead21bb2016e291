"""How project reservations were used: per window, reserved, used and reserved-but-unused
GPU-hours (the calendar shows them, accounting sums the unused per project).

A window's reserved GPU-hours are its GPUs (``gpus``, or the whole GPUs of its nodes, of its
model) times its elapsed length (up to now). Used: the project's bookings' GPU-equivalents held
inside the window, at most the reserved GPUs at each moment. With ``idle_release_minutes`` a
window stops being reserved, for what no member uses, once it is released: only the GPUs in
use then stay reserved (and used) to its end.
"""

from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db.models import Q

from portal.models import Allocation, ProjectReservation
from portal.services.access import permissions
from portal.services.booking.project_reservations import hold_rule
from portal.services.core.clock import from_epoch, to_epoch
from portal.services.inventory import selectors as inventory
from scheduler.holds import occurrences

# Windows one reservation is reported over at most (ten years of a weekly one).
MAX_WINDOWS = 520


@dataclass(frozen=True)
class WindowUse:
    """One window of a reservation and its use so far."""

    reservation_id: int
    project: str
    start: datetime
    end: datetime
    gpus: int
    reserved_gpu_hours: float
    used_gpu_hours: float
    in_use_now: float  # GPU-equivalents members hold on it now (0 outside the window)

    @property
    def unused_gpu_hours(self) -> float:
        return max(0.0, self.reserved_gpu_hours - self.used_gpu_hours)


def reserved_gpus(reservation: ProjectReservation) -> int:
    """How many GPUs a reservation sets aside (``gpus``, or its nodes' whole GPUs)."""
    if reservation.gpus:
        return reservation.gpus
    site = inventory.gpus_bookable().filter(node__in=list(reservation.nodes.all()))
    if reservation.gpu_model:
        site = site.filter(model=reservation.gpu_model)
    return site.count()


def reservation_windows(
    reservation: ProjectReservation, *, since: datetime, until: datetime
) -> list[tuple[datetime, datetime]]:
    """The reservation's windows overlapping [since, until), at most MAX_WINDOWS."""
    rule = hold_rule(reservation)
    found = occurrences(rule, to_epoch(since), to_epoch(until), limit=MAX_WINDOWS)
    return [(from_epoch(s), from_epoch(e)) for s, e in found]


def windows_use(
    reservations, *, since: datetime, until: datetime, now: datetime
) -> list[WindowUse]:
    """Every window of ``reservations`` overlapping [since, until) with its use up to now."""
    out = []
    for reservation in reservations:
        windows = reservation_windows(reservation, since=since, until=until)
        if not windows:
            continue
        gpus = reserved_gpus(reservation)
        spans = _member_spans(reservation, windows[0][0], windows[-1][1])
        for start, end in windows:
            out.append(_use(reservation, gpus, spans, (start, end), (since, until), now))
    return out


def _member_spans(reservation, since: datetime, until: datetime):
    """(start, end, GPU-equivalents) of the project's allocations that ran in [since, until)."""
    rows = Allocation.objects.filter(
        Q(live=True) | Q(booking__started_at__isnull=False),
        booking__project_id=reservation.project_id,
        start__lt=until,
        end__gt=since,
    ).values_list("start", "end", "fraction")
    return [(s, e, f) for s, e, f in rows]


def _use(reservation, gpus: int, spans, window, clip, now: datetime):
    """One window's reserved and used GPU-hours inside ``clip`` (since, until), up to ``now``."""
    start, end = window
    idle = reservation.idle_release_minutes
    released = start + timedelta(minutes=idle) if idle is not None else None
    lo, upto = max(start, clip[0]), min(end, now, clip[1])
    moments = sorted({lo, upto} | {t for s, e, _ in spans for t in (s, e) if lo < t < upto})
    reserved = used = 0.0
    for left, right in zip(moments, moments[1:], strict=False):
        if right <= left:
            continue
        held = min(gpus, sum(f for s, e, f in spans if s <= left and e >= right))
        hours = (right - left).total_seconds() / 3600.0
        after_release = released is not None and left >= released
        reserved += (held if after_release else gpus) * hours
        used += held * hours
    in_use = 0.0
    if start <= now < end:
        in_use = min(gpus, sum(f for s, e, f in spans if s <= now < e))
    project = reservation.project.slug
    return WindowUse(reservation.pk, project, start, end, gpus, reserved, used, in_use)


RESERVED_UNUSED = "reserved_unused_gpu_hours"


def reserved_unused_by_project(*, since: datetime, until: datetime, now: datetime, user=None):
    """Reserved-but-unused GPU-hours per project slug over [since, until) (up to now); with
    ``user``, of the projects whose accounting that user may see."""
    qs = ProjectReservation.objects.select_related("project").prefetch_related("nodes")
    qs = qs.filter(start__lt=until).filter(Q(weekly=True) | Q(end__gt=since))
    if user is not None:
        match = permissions.visible_filter(
            user, "accounting.view", owner_field=None, project_field="project_id"
        )
        if match is not None:
            qs = qs.filter(match)
    totals: dict[str, float] = {}
    for use in windows_use(qs.order_by("start", "id"), since=since, until=until, now=now):
        totals[use.project] = totals.get(use.project, 0.0) + use.unused_gpu_hours
    return totals


def with_reserved_unused(rows: list[dict], **period) -> list[dict]:
    """Accounting's project rows with each project's reserved-but-unused GPU-hours (a row of
    no use for a project that reserved but booked nothing)."""
    unused = reserved_unused_by_project(**period)
    seen = set()
    for row in rows:
        seen.add(row["project"])
        row[RESERVED_UNUSED] = round(unused.get(row["project"], 0.0), 3)
    for project in sorted(set(unused) - seen):
        rows.append(
            {
                "project": project,
                "bookings": 0,
                "gpu_hours": 0.0,
                "borrowed_gpu_hours": 0.0,
                "cpu_hours": 0.0,
                "memory_gb_hours": 0.0,
                "energy_kwh": 0.0,
                "mean_utilization": None,
                "peak_memory_mib": None,
                RESERVED_UNUSED: round(unused[project], 3),
            }
        )
    return rows
