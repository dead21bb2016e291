"""The calendar's project reservations lane: each window shown in the week, with its use."""

from dataclasses import dataclass
from datetime import datetime

from django.db.models import Q

from portal.services.booking.project_reservations import visible_reservations
from portal.services.reporting.reservations import windows_use
from portal.web.calendar import geometry


@dataclass(frozen=True)
class ReservationBar:
    """One reservation window on the lane, in percent of the page's span."""

    left: float
    width: float
    label: str
    title: str


def reservation_bars(*, user, since: datetime, until: datetime, now: datetime):
    """The windows of the reservations ``user`` may see that overlap [since, until)."""
    reservations = visible_reservations(user).filter(
        Q(weekly=True) | Q(end__gt=since), start__lt=until
    )
    bars = []
    for use in windows_use(reservations, since=since, until=until, now=now):
        place = geometry(use.start, use.end, since, until)
        if place is None:
            continue
        label = f"{use.project} · {use.gpus} GPUs"
        title = (
            f"Project reservation {use.reservation_id} for {use.project}: {use.gpus} GPUs, "
            f"{use.start:%a %d %b %H:%M} to {use.end:%a %d %b %H:%M} UTC; used "
            f"{use.used_gpu_hours:.1f} of {use.reserved_gpu_hours:.1f} reserved GPU-hours so far"
            f", {use.in_use_now:g} GPUs in use now"
        )
        bars.append(ReservationBar(place[0], place[1], label, title))
    return bars
