"""Formatting for the pages. static/portal/live.js formats live readings the same way."""

import json
from datetime import timedelta

from django import template
from django.utils import dateformat, timezone

from portal.services.access import permissions

register = template.Library()

NO_READING = "no reading yet"


@register.filter
def json_text(value) -> str:
    """An audit event's before or after as compact JSON ("—" when there is none)."""
    if value is None:
        return "—"
    return json.dumps(value, sort_keys=True, ensure_ascii=False)


@register.simple_tag(takes_context=True)
def user_can(context, action: str, booking) -> bool:
    """Whether the page's user may do `action` (permissions.CAN) to `booking`."""
    request = context["request"]
    if not hasattr(request, "_managed_projects"):
        request._managed_projects = permissions.managed_project_ids(request.user)
    return permissions.can(
        request.user,
        action,
        owner_id=booking.owner_id,
        project_id=booking.project_id,
        managed=request._managed_projects,
    )


@register.simple_tag(takes_context=True)
def user_may(context, action: str) -> bool:
    """Whether the page's user may do `action` (permissions.CAN) to anything: a link to show."""
    return permissions.can_some(context["request"].user, action)


NOT_MEASURED = "not measured"


@register.filter
def gib(mib) -> str:
    if mib is None:
        return "—"
    return f"{mib / 1024:.1f} GiB"


@register.simple_tag
def metric(reading, key: str) -> str:
    """A reading's value as text; utilization None on a device with a reading is NOT zero."""
    if not reading:
        return NO_READING if key == "utilization_gpu" else "—"
    value = reading.get(key)
    if value is None:
        return NOT_MEASURED if key.startswith("utilization") else "—"
    if key.startswith("utilization"):
        return f"{value:.0f} %"
    if key == "memory_used_mib":
        total = reading.get("memory_total_mib")
        return (
            f"{value / 1024:.1f} / {total / 1024:.0f} GiB" if total else f"{value / 1024:.1f} GiB"
        )
    if key == "temperature_c":
        return f"{value:.0f} °C"
    if key == "power_w":
        return f"{value:.0f} W"
    return str(value)


@register.simple_tag
def meter(reading, key: str = "utilization_gpu") -> str:
    """Width in percent for a small bar, or empty when there is nothing measured."""
    if not reading or reading.get(key) is None:
        return "0"
    return f"{max(0.0, min(100.0, float(reading[key]))):.0f}"


@register.filter
def duration(value) -> str:
    """A timedelta or seconds as '2 d 3 h', '3 h 20 min', '5 min' or, under a minute, '31 s'."""
    if value is None or value == "":
        return "—"
    seconds = int(value.total_seconds() if isinstance(value, timedelta) else value)
    days, rest = divmod(max(seconds, 0), 86400)
    hours, rest = divmod(rest, 3600)
    minutes = rest // 60
    if days:
        return f"{days} d {hours} h" if hours else f"{days} d"
    if hours:
        return f"{hours} h {minutes} min" if minutes else f"{hours} h"
    return f"{minutes} min" if minutes else f"{rest} s"


@register.filter
def when(value) -> str:
    """A moment as '2026-12-03 08:05' in the site's zone (UTC), the year always there; '' for
    none (so `|default:"—"` applies). The CLI prints the same (portal/cli/output.py)."""
    if not value:
        return ""
    shown = timezone.localtime(value) if timezone.is_aware(value) else value
    return dateformat.format(shown, "Y-m-d H:i")


@register.filter
def get_item(mapping, key):
    return mapping.get(key) if mapping else None


@register.simple_tag
def fairshare_charge() -> str:
    """What the fair-share factor charges, for priority breakdowns."""
    from portal.services.allocation.snapshot import scheduler_policy
    from portal.services.booking.fairshare import charge_description

    return charge_description(scheduler_policy())
