"""Telemetry history for charts, read through the telemetry service when it is installed."""

from datetime import datetime, timedelta

RANGES = {"hour": timedelta(hours=1), "day": timedelta(days=1), "week": timedelta(days=7)}


def range_window(name: str, now: datetime) -> tuple[str, datetime, datetime]:
    """A known range name (default: hour) and its window ending now."""
    name = name if name in RANGES else "hour"
    return name, now - RANGES[name], now


def device_history(*, uuid: str, since: datetime, until: datetime) -> list[dict] | None:
    """Samples of one device, or None when the portal keeps no history (service missing)."""
    try:
        from portal.services.telemetry import samples_history
    except ImportError:
        return None
    return samples_history(uuid=uuid, since=since, until=until, max_points=1500)
