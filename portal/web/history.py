"""Telemetry history for charts, read through the telemetry service when it is installed."""

from datetime import datetime, timedelta

RANGES = {"hour": timedelta(hours=1), "day": timedelta(days=1), "week": timedelta(days=7)}
LONGEST = timedelta(days=31)


def range_window(
    name: str, now: datetime, start: str = "", end: str = ""
) -> tuple[str, datetime, datetime, str]:
    """(range name, since, until, error): hour, day or week ending now (default hour), or
    "custom" from `start` to `end` (ISO 8601, UTC when no offset; end defaults to now). A bad
    custom range falls back to the last hour with the reason."""
    if name == "custom" or (start and name not in RANGES):
        try:
            since = _utc(datetime.fromisoformat(start), now)
            until = _utc(datetime.fromisoformat(end), now) if end else now
        except ValueError:
            return "hour", now - RANGES["hour"], now, "From and to are dates and times."
        if since >= until:
            return "hour", now - RANGES["hour"], now, "The start must be before the end."
        if until - since > LONGEST:
            return "hour", now - RANGES["hour"], now, "A range is at most 31 days."
        return "custom", since, min(until, now), ""
    name = name if name in RANGES else "hour"
    return name, now - RANGES[name], now, ""


def _utc(value: datetime, now: datetime) -> datetime:
    return value if value.tzinfo else value.replace(tzinfo=now.tzinfo)


def device_history(*, uuid: str, since: datetime, until: datetime) -> list[dict] | None:
    """Samples of one device, or None when the portal keeps no history (service missing)."""
    try:
        from portal.services.fleet.selectors import samples_history
    except ImportError:
        return None
    return samples_history(uuid=uuid, since=since, until=until, max_points=1500)
