"""Reads of access data: the audit log (who may see which rows, the filters, the export columns)
and a user's API tokens (writes live in `audit`, `tokens`, `sso`, `accounts`)."""

import json
from datetime import datetime

from portal.models import ApiToken, AuditEvent
from portal.services.access import permissions

CSV_COLUMNS = [
    "id",
    "at",
    "actor",
    "address",
    "via",
    "action",
    "target_type",
    "target_id",
    "project",
    "before",
    "after",
]


def audit_events_visible(user):
    """The events `user` may read (permissions.CAN["audit.view"]): all, their projects', none."""
    match = permissions.visible_filter(
        user, "audit.view", owner_field=None, project_field="project_id"
    )
    qs = AuditEvent.objects.all()
    return qs if match is None else qs.filter(match)


def audit_events_filter(
    events,
    *,
    action: str = "",
    actor: str = "",
    project: str = "",
    target_type: str = "",
    target_id: str = "",
    since: datetime | None = None,
    until: datetime | None = None,
):
    """Narrow `events`; an action ending in "." matches its whole family ("booking.")."""
    if action:
        events = (
            events.filter(action__startswith=action)
            if action.endswith(".")
            else events.filter(action=action)
        )
    if actor:
        events = events.filter(actor_name=actor)
    if project:
        events = events.filter(project_slug=project)
    if target_type:
        events = events.filter(target_type=target_type)
    if target_id:
        events = events.filter(target_id=target_id)
    if since:
        events = events.filter(at__gte=since)
    if until:
        events = events.filter(at__lt=until)
    return events.order_by("-at", "-id")


def audit_row(event: AuditEvent, *, text: bool = False) -> dict:
    """One event as a row; with `text` (CSV) before and after are JSON text."""
    if not text:
        return {**audit_row(event, text=True), "before": event.before, "after": event.after}
    return {
        "id": event.id,
        "at": event.at.isoformat(),
        "actor": event.actor_name,
        "address": event.address,
        "via": event.via,
        "action": event.action,
        "target_type": event.target_type,
        "target_id": event.target_id,
        "project": event.project_slug,
        "before": "" if event.before is None else json.dumps(event.before, sort_keys=True),
        "after": "" if event.after is None else json.dumps(event.after, sort_keys=True),
    }


def tokens_of(*, user):
    """A user's tokens, newest first (never their keys, which are not stored)."""
    return ApiToken.objects.filter(user=user).order_by("-created", "id")
