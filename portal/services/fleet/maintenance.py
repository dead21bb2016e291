"""Maintenance windows: staff take nodes out of service for a span, with a reason.

A window is an input of the allocator (scheduler/calendar.py, built for each pass by
``portal.services.inventory.windows``): nothing is placed on its nodes that would overlap it. Creating,
changing or deleting one writes the row and one fact (``MAINTENANCE_CHANGED``) in one
transaction; after commit its subscriber tells the owners of the bookings it collides with and
asks for a pass, which moves the planned starts it is in the way of (the owners of those hear
of it from the planned-start-moved scan, with the window named as the reason). A window never
ends or deletes a booking. ``maintenance_cycle`` (a periodic job) drains the nodes at the start
(``Node.State.MAINTENANCE``) and returns them to service at the end.
"""

from dataclasses import dataclass
from datetime import datetime

from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from portal.errors import NotAllowed, NotFound, ValidationFailed
from portal.models import Allocation, Booking, MaintenanceWindow, Node
from portal.services.access import permissions
from portal.services.access.audit import SYSTEM, Source, audit_record
from portal.services.booking import events
from portal.services.core.locking import lock_nodes
from portal.services.core.outbox import fact_record
from portal.services.inventory.windows import window_nodes

MAINTENANCE_CHANGED = "maintenance_changed"
# Bounds of one request (checked before anything is read).
MAX_NODES = 1000
MAX_REASON = 200


@dataclass(frozen=True)
class WindowSpec:
    """A window as asked for: node host names (empty, with no group: every node), a network
    group, the span and the reason."""

    nodes: tuple[str, ...]
    network_group: str
    start: datetime
    end: datetime
    reason: str


def window_collisions(window: MaintenanceWindow) -> list[Booking]:
    """The running and planned bookings that hold devices of its nodes during the window."""
    nodes = [node.pk for node in window_nodes(window)]
    ids = (
        Allocation.objects.filter(
            live=True, gpu__node_id__in=nodes, start__lt=window.end, end__gt=window.start
        )
        .filter(booking__state__in=(Booking.State.ACTIVE, Booking.State.PLANNED))
        .values_list("booking_id", flat=True)
    )
    return list(
        Booking.objects.filter(pk__in=set(ids)).select_related("owner", "project").order_by("pk")
    )


def maintenance_create(
    *, actor, spec: WindowSpec, now: datetime, source: Source = SYSTEM
) -> tuple[MaintenanceWindow, list[Booking]]:
    """Create a window; returns it and the bookings it collides with (their owners are told
    after commit, and a pass re-plans the queue around it)."""
    _check_staff(actor)
    node_ids = window_validate(spec, now)
    with transaction.atomic():  # the admin saves inside its own transaction
        _lock_covered(node_ids, spec.network_group)
        window = MaintenanceWindow.objects.create(
            reason=spec.reason,
            start=spec.start,
            end=spec.end,
            network_group=spec.network_group,
            created_by=actor,
        )
        window.nodes.set(node_ids)
        collisions = window_collisions(window)
        audit_record(
            action="maintenance.create",
            actor=actor,
            source=source,
            target=window,
            after=_audited(window),
        )
        _changed(window, "created", collisions)
    return window, collisions


def maintenance_update(
    *, actor, window_id: int, changes: dict, now: datetime, source: Source = SYSTEM
) -> tuple[MaintenanceWindow, list[Booking]]:
    """Change a window's span, nodes, group or reason (``changes`` names the fields given);
    the queue is re-planned and the owners of the bookings it now collides with are told."""
    _check_staff(actor)
    with transaction.atomic():  # the admin saves inside its own transaction
        window = _locked(window_id)
        before = _audited(window)
        spec = WindowSpec(
            nodes=tuple(changes.get("nodes", [n.hostname for n in window.nodes.all()])),
            network_group=changes.get("network_group", window.network_group),
            start=changes.get("start", window.start),
            end=changes.get("end", window.end),
            reason=changes.get("reason", window.reason),
        )
        node_ids = window_validate(spec, now)
        _lock_covered(node_ids, spec.network_group)
        window.reason, window.start, window.end = spec.reason, spec.start, spec.end
        window.network_group = spec.network_group
        window.save(update_fields=["reason", "start", "end", "network_group"])
        window.nodes.set(node_ids)
        collisions = window_collisions(window)
        audit_record(
            action="maintenance.change",
            actor=actor,
            source=source,
            target=window,
            before=before,
            after=_audited(window),
        )
        _changed(window, "changed", collisions)
    return window, collisions


def maintenance_delete(*, actor, window_id: int, source: Source = SYSTEM) -> None:
    """Delete a window; the queue is re-planned (its nodes return at the next cycle)."""
    _check_staff(actor)
    with transaction.atomic():  # the admin saves inside its own transaction
        window = _locked(window_id)
        audit_record(
            action="maintenance.delete",
            actor=actor,
            source=source,
            target=window,
            before=_audited(window),
        )
        _changed(window, "deleted", [])
        window.delete()


def _lock_covered(node_ids: list[int], group: str) -> None:
    """Lock the rows of the nodes a window will cover (sorted, as every booking writer does):
    a start or reservation placed there meanwhile commits first and is listed as a collision,
    and one placed after sees the window (``pass_start`` re-checks under the same locks)."""
    covered = Node.objects.all()
    if node_ids or group:
        wanted = Q(pk__in=node_ids)
        if group:
            wanted |= Q(network_group=group)
        covered = covered.filter(wanted)
    lock_nodes(covered.values_list("pk", flat=True))


def _locked(window_id: int) -> MaintenanceWindow:
    window = MaintenanceWindow.objects.select_for_update().filter(pk=window_id).first()
    if window is None:
        raise NotFound(f"No maintenance window {window_id}.")
    return window


def _check_staff(actor) -> None:
    if not permissions.can(actor, "maintenance.edit"):
        raise NotAllowed("Only staff with the right to change maintenance windows may do that.")


def window_validate(spec: WindowSpec, now: datetime) -> list[int]:
    """The ids of the nodes named, once every field is valid (else a 400 naming the field)."""
    if not spec.reason.strip():
        raise ValidationFailed.field("reason", "say why the nodes go into maintenance")
    if len(spec.reason) > MAX_REASON:
        raise ValidationFailed.field("reason", f"at most {MAX_REASON} characters")
    if spec.end <= spec.start:
        raise ValidationFailed.field("end", "must be after start")
    if spec.end <= now:
        raise ValidationFailed.field("end", "the window lies wholly in the past")
    if len(spec.nodes) > MAX_NODES:
        raise ValidationFailed.field("nodes", f"at most {MAX_NODES} nodes")
    names = sorted(set(spec.nodes))
    known = dict(Node.objects.filter(hostname__in=names).values_list("hostname", "pk"))
    unknown = [name for name in names if name not in known]
    if unknown:
        raise ValidationFailed.field("nodes", f"unknown node {unknown[0]!r}")
    group = spec.network_group
    if group and not Node.objects.filter(network_group=group).exists():
        raise ValidationFailed.field("network_group", f"no node is in network group {group!r}")
    return [known[name] for name in names]


def _audited(window: MaintenanceWindow) -> dict:
    return {
        "reason": window.reason,
        "start": window.start.isoformat(),
        "end": window.end.isoformat(),
        "network_group": window.network_group,
        "nodes": sorted(window.nodes.values_list("hostname", flat=True)),
    }


def _changed(window: MaintenanceWindow, change: str, collisions: list[Booking]) -> None:
    fact_record(
        kind=MAINTENANCE_CHANGED,
        payload={
            "window": window.pk,
            "change": change,
            "reason": window.reason,
            "start": window.start.isoformat(),
            "end": window.end.isoformat(),
            "nodes": [node.hostname for node in window_nodes(window)],
            "collisions": [booking.pk for booking in collisions],
            "cause": "site",
        },
    )


def maintenance_cycle(*, now: datetime | None = None) -> bool:
    """Drain the up nodes of the windows under way and return the nodes of windows over (or
    deleted) to service, each by compare-and-set. Returns whether any node changed."""
    now = now or timezone.now()
    current = {}
    for window in MaintenanceWindow.objects.filter(start__lte=now, end__gt=now).order_by("start"):
        for node in window_nodes(window):
            current.setdefault(node.pk, window)
    changed = False
    for node_id, window in current.items():
        reason = f"maintenance window {window.pk}: {window.reason}"[:300]
        changed |= _set_state(node_id, Node.State.UP, Node.State.MAINTENANCE, reason, "maintenance")
    over = Node.objects.filter(state=Node.State.MAINTENANCE).exclude(pk__in=list(current))
    for node_id in over.values_list("pk", flat=True):
        changed |= _set_state(node_id, Node.State.MAINTENANCE, Node.State.UP, "", "return")
    return changed


def _set_state(node_id: int, old: str, new: str, reason: str, change: str) -> bool:
    with transaction.atomic():
        if not Node.objects.filter(pk=node_id, state=old).update(state=new, state_reason=reason):
            return False  # someone else changed it (a heartbeat, staff): theirs stands
        events.node_changed(node_id=node_id, change=change)
    return True
