"""Whether a booked device is "in use" or only "booked", without flipping on idle noise.

A device counts as in use from a reading at or above IN_USE_UTIL_ON percent until one at or below
IN_USE_UTIL_OFF (hysteresis), judged over its readings of the last IN_USE_WINDOW_S seconds: an
idle GPU whose utilization hovers around a few percent stays "booked", a busy one with a short dip
stays "in use".
"""

from collections.abc import Iterable
from datetime import datetime, timedelta

from django.conf import settings

from portal.models import Sample


def busy_after(utilizations: Iterable[float | None], *, on: float, off: float) -> bool:
    """Run the hysteresis over readings, oldest first: busy from one >= `on` until one <= `off`.

    Unmeasured readings (None) change nothing. Starts idle.
    """
    busy = False
    for value in utilizations:
        if value is None:
            continue
        if value >= on:
            busy = True
        elif value <= off:
            busy = False
    return busy


def busy_devices(*, uuids: Iterable[str], latest: dict, now: datetime) -> set[str]:
    """The devices among `uuids` whose recent utilization says they are in use.

    Their stored samples of the last IN_USE_WINDOW_S seconds, then the latest reading (from the
    cache, which may be newer than what is stored), in one query for all of them.
    """
    uuids = sorted(set(uuids))
    if not uuids:
        return set()
    since = now - timedelta(seconds=settings.IN_USE_WINDOW_S)
    series: dict[str, list] = {uuid: [] for uuid in uuids}
    stored = (
        Sample.objects.filter(uuid__in=uuids, time__gte=since, time__lte=now)
        .order_by("uuid", "time")
        .values_list("uuid", "time", "utilization_gpu")
    )
    last_time: dict[str, datetime] = {}
    for uuid, time, utilization in stored:
        series[uuid].append(utilization)
        last_time[uuid] = time
    for uuid in uuids:
        reading = latest.get(uuid)
        if reading and _newer(reading.get("time"), last_time.get(uuid)):
            series[uuid].append(reading.get("utilization_gpu"))
    on, off = settings.IN_USE_UTIL_ON, settings.IN_USE_UTIL_OFF
    return {uuid for uuid, values in series.items() if busy_after(values, on=on, off=off)}


def _newer(time, stored: datetime | None) -> bool:
    if stored is None:
        return True
    if isinstance(time, str):
        try:
            time = datetime.fromisoformat(time.replace("Z", "+00:00"))
        except ValueError:
            return False
    return isinstance(time, datetime) and time > stored
