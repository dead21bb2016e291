"""The audit log's one writer: `audit_record`, called inside the transaction of the change it
records, so a row exists exactly when the change committed.

Who and from where reach a service explicitly, as a `Source` (via: web, api, admin or system;
the client address the site's trusted proxies report). Services that other parts of the portal
add (idle reclaim, single sign-on) call `audit_record` the same way.
"""

from dataclasses import dataclass
from typing import Any

from django.core.serializers.json import DjangoJSONEncoder
from django.db import models

from portal.models import AuditEvent
from portal.services.access.login_throttle import client_address

Via = AuditEvent.Via

# Every action the log records, in one list (filters and docs read it).
ACTIONS = (
    "booking.submit",
    "booking.cancel",
    "booking.extend",
    "booking.release",
    "booking.preempt",
    "booking.requeue",
    "booking.fail",
    "booking.reclaim",
    "quota.create",
    "quota.change",
    "quota.delete",
    "membership.create",
    "membership.change",
    "membership.delete",
    "node.create",
    "node.change",
    "node.delete",
    "node.drain",
    "node.return",
    "maintenance.create",
    "maintenance.change",
    "maintenance.delete",
    "gpu.sharing",
    "token.create",
    "token.revoke",
    "login",
    "login.failed",
    "gpu.mig_layout",
)


@dataclass(frozen=True)
class Source:
    """Where an action came from: the interface and the client's address."""

    via: str
    address: str = ""


SYSTEM = Source(via=Via.SYSTEM)


def source_of(request, via: str | None = None) -> Source:
    """The Source of a request; `via` defaults from its path (/admin/, /api/, else web)."""
    if via is None:
        path = getattr(request, "path", "")
        via = (
            Via.ADMIN
            if path.startswith("/admin/")
            else Via.API
            if path.startswith("/api/")
            else Via.WEB
        )
    return Source(via=via, address=client_address(request)[:64])


def snapshot(obj: models.Model, fields: list[str] | None = None) -> dict[str, Any]:
    """The object's concrete field values (foreign keys by id), as JSON would store them."""
    names = fields or [f.attname for f in obj._meta.concrete_fields]
    return {name: _plain(getattr(obj, name)) for name in names}


def changes(before: dict | None, after: dict | None) -> tuple[dict | None, dict | None]:
    """Only what differs, when both sides exist (a create or delete keeps its whole side)."""
    if before is None or after is None:
        return before, after
    keys = [k for k in after if before.get(k) != after.get(k)]
    return {k: before.get(k) for k in keys}, {k: after[k] for k in keys}


def _plain(value):
    if value is None or isinstance(value, bool | int | float | str | list | dict):
        return value
    return DjangoJSONEncoder().default(value)


def audit_record(
    *,
    action: str,
    actor=None,
    source: Source = SYSTEM,
    target: models.Model | None = None,
    target_type: str = "",
    target_id: str | int = "",
    project=None,
    project_id: int | None = None,
    before: dict | None = None,
    after: dict | None = None,
    actor_name: str = "",
) -> AuditEvent:
    """Append one audit row. `project` (a Project) makes it visible to that project's managers;
    `project_id` names it when the Project has just been deleted (its pk is then None)."""
    if action not in ACTIONS:
        raise ValueError(f"Unknown audit action {action!r}; add it to ACTIONS.")
    if target is not None:
        target_type = target_type or target._meta.model_name
        target_id = target_id or target.pk
    is_user = actor is not None and getattr(actor, "is_authenticated", False)
    return AuditEvent.objects.create(
        action=action,
        actor=actor if is_user else None,
        actor_name=(actor.get_username() if is_user else actor_name)[:150],
        address=source.address,
        via=source.via,
        target_type=target_type,
        target_id=str(target_id),
        project_id=project_id or (project.pk if project is not None else None),
        project_slug=project.slug if project is not None else "",
        before=before,
        after=after,
    )


BOOKING_FIELDS = [
    "state",
    "owner_id",
    "project_id",
    "gpus",
    "mig_profile",
    "gpu_model",
    "mixed_models",
    "gpu_fraction",
    "gpu_memory_mib",
    "qos",
    "start",
    "end",
    "duration_s",
    "state_detail",
]


def booking_state(booking) -> dict[str, Any]:
    """What the log keeps of a booking, before or after a command."""
    return snapshot(booking, BOOKING_FIELDS)


def audit_booking(
    *, action: str, booking, actor=None, source: Source = SYSTEM, before: dict | None = None
) -> AuditEvent:
    """Record a booking command: `before` as read ahead of it, the booking as it is now after."""
    before, after = changes(before, booking_state(booking))
    return audit_record(
        action=action,
        actor=actor,
        source=source,
        target=booking,
        project=booking.project,
        before=before,
        after=after,
    )
