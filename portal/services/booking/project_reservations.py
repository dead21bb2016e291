"""Project reservations: staff set capacity aside for a project (docs/scheduling.md).

``reservation_spec`` validates a request once into a frozen ``ReservationSpec`` (every refusal a
400 naming its field); ``reservation_create``/``reservation_update``/``reservation_delete`` write
it and record one fact, after which the allocation pass re-plans (``reservation_fact_pass_request``)
and the pass's own notifications tell owners whose planned start moved. A reservation never
ends or moves a booking itself. ``hold_rules`` is what the snapshot builder reads.
"""

from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db import transaction
from django.db.models import Q
from django.utils import timezone

import scheduler
from portal.errors import NotAllowed, NotFound, ValidationFailed
from portal.models import Allocation, Node, Project, ProjectReservation
from portal.services.booking.events import request_allocation_pass
from portal.services.core.clock import from_epoch, to_epoch
from portal.services.core.outbox import fact_record
from portal.services.inventory import selectors as inventory
from scheduler.holds import HORIZON_S, WEEK_S, HoldRule, choose_devices, claimed, occurrences
from scheduler.reserve import Hold

RESERVATION_CHANGED = "reservation_changed"
MAX_NODES = 64  # nodes one reservation may name
MAX_RULES = 500  # reservations one pass reads (each expands to at most MAX_OCCURRENCES windows)
MAX_IDLE_RELEASE_MINUTES = 7 * 24 * 60


@dataclass(frozen=True)
class ReservationSpec:
    """A validated project reservation, ready to write."""

    project: Project
    gpus: int | None
    gpu_model: str
    nodes: tuple[Node, ...]
    start: datetime
    end: datetime
    weekly: bool
    idle_release_minutes: int | None
    note: str = ""


def reservation_spec(
    *,
    project: str,
    start: datetime,
    end: datetime,
    now: datetime,
    gpus: int | None = None,
    gpu_model: str = "",
    nodes: list[str] | tuple[str, ...] = (),
    weekly: bool = False,
    idle_release_minutes: int | None = None,
    note: str = "",
) -> ReservationSpec:
    """Validate a reservation (raises ValidationFailed naming the field)."""
    found = Project.objects.filter(slug=project).first()
    if found is None:
        raise ValidationFailed.field("project", f"no project {project!r}")
    if end <= start:
        raise ValidationFailed.field("end", "must be after start")
    if weekly and end - start > timedelta(seconds=WEEK_S):
        raise ValidationFailed.field("weekly", "a weekly window longer than 7 days overlaps itself")
    if not weekly and end <= now:
        raise ValidationFailed.field("end", "a one-off reservation must not lie wholly in the past")
    if (
        idle_release_minutes is not None
        and not 1 <= idle_release_minutes <= MAX_IDLE_RELEASE_MINUTES
    ):
        raise ValidationFailed.field(
            "idle_release_minutes", f"must be between 1 and {MAX_IDLE_RELEASE_MINUTES}"
        )
    named = _nodes(nodes)
    _check_capacity(gpus, gpu_model, named)
    return ReservationSpec(
        found, gpus, gpu_model, named, start, end, weekly, idle_release_minutes, note
    )


def _nodes(names) -> tuple[Node, ...]:
    if len(names) > MAX_NODES:
        raise ValidationFailed.field("nodes", f"at most {MAX_NODES} nodes")
    wanted = sorted(set(names))
    found = {n.hostname: n for n in Node.objects.filter(hostname__in=wanted)}
    unknown = [name for name in wanted if name not in found]
    if unknown:
        raise ValidationFailed.field("nodes", f"unknown node {unknown[0]!r}")
    return tuple(found[name] for name in wanted)


def _check_capacity(gpus: int | None, gpu_model: str, nodes: tuple[Node, ...]) -> None:
    """The reservation fits what its nodes (or the site) have of its model."""
    if gpus is None and not nodes:
        raise ValidationFailed.field("gpus", "name a number of GPUs or the nodes to reserve")
    site = inventory.gpus_bookable()
    if gpu_model and not site.filter(model=gpu_model).exists():
        raise ValidationFailed.field("gpu_model", f"no GPUs of model {gpu_model!r}")
    candidates = site.filter(model=gpu_model) if gpu_model else site
    if nodes:
        candidates = candidates.filter(node__in=nodes)
    have = candidates.count()
    where = "the nodes named" if nodes else "the site"
    of = f" of model {gpu_model}" if gpu_model else ""
    if gpus is None and not have:
        raise ValidationFailed.field("nodes", f"{where} have no whole GPUs{of}")
    if gpus is not None and gpus > have:
        raise ValidationFailed.field("gpus", f"more than the {have} whole GPUs{of} {where} hold")


def reservation_create(*, user, spec: ReservationSpec) -> ProjectReservation:
    """Write a new reservation and record the fact (the pass re-plans after commit)."""
    with transaction.atomic():
        reservation = ProjectReservation(created_by=user)
        _write(reservation, spec)
        reservation_changed(reservation_id=reservation.pk, change="created")
    return reservation


def reservation_update(*, reservation: ProjectReservation, spec: ReservationSpec):
    """Rewrite a reservation from a validated spec; the pass re-plans after commit."""
    with transaction.atomic():
        _write(reservation, spec)
        reservation_changed(reservation_id=reservation.pk, change="changed")
    return reservation


def reservation_delete(*, reservation: ProjectReservation) -> None:
    """Delete a reservation (never a booking); the pass re-plans after commit."""
    with transaction.atomic():
        pk = reservation.pk
        reservation.delete()
        reservation_changed(reservation_id=pk, change="deleted")


def _write(reservation: ProjectReservation, spec: ReservationSpec) -> None:
    for name in ("project", "gpus", "gpu_model", "start", "end", "weekly", "note"):
        setattr(reservation, name, getattr(spec, name))
    reservation.idle_release_minutes = spec.idle_release_minutes
    reservation.full_clean(exclude=["nodes", "created_by"])
    reservation.save()
    reservation.nodes.set(spec.nodes)


def reservation_changed(*, reservation_id: int, change: str) -> None:
    """Record that a reservation was created, changed or deleted, in the caller's transaction."""
    fact_record(
        kind=RESERVATION_CHANGED,
        payload={"reservation": reservation_id, "change": change, "cause": "site"},
    )


def reservation_fact_pass_request(fact) -> None:
    """Subscriber: a reservation changed, so the queue may move: ask for an allocation pass."""
    request_allocation_pass()


def visible_reservations(user):
    """Reservations a user may see: staff all, others their projects'."""
    qs = ProjectReservation.objects.select_related("project").prefetch_related("nodes")
    if user.is_staff:
        return qs.order_by("start", "id")
    return qs.filter(project__memberships__user=user).order_by("start", "id").distinct()


def reservation_for_staff(*, user, pk) -> ProjectReservation:
    """The reservation ``pk`` for a staff user's change (403 for others, 404 unknown)."""
    if not user.is_staff:
        raise NotAllowed("Only staff may change project reservations.")
    try:
        return ProjectReservation.objects.get(pk=int(pk))
    except (TypeError, ValueError, ProjectReservation.DoesNotExist) as exc:
        raise NotFound(f"No reservation {pk}.") from exc


def hold_rules(*, now: datetime) -> tuple[HoldRule, ...]:
    """The reservations that may hold devices from ``now`` within the planning horizon, as the
    scheduler's rules (at most MAX_RULES, earliest first)."""
    ahead = now + timedelta(seconds=HORIZON_S)
    rows = (
        ProjectReservation.objects.filter(Q(weekly=True) | Q(end__gt=now), start__lt=ahead)
        .select_related("project")
        .prefetch_related("nodes")
        .order_by("start", "id")[:MAX_RULES]
    )
    return tuple(hold_rule(r) for r in rows)


def hold_rule(reservation: ProjectReservation) -> HoldRule:
    """One reservation as the scheduler's rule."""
    idle = reservation.idle_release_minutes
    return HoldRule(
        rule_id=str(reservation.pk),
        project=reservation.project.slug,
        start=to_epoch(reservation.start),
        end=to_epoch(reservation.end),
        gpus=reservation.gpus,
        gpu_model=reservation.gpu_model or None,
        nodes=tuple(sorted(n.hostname for n in reservation.nodes.all())),
        weekly=reservation.weekly,
        idle_release_s=None if idle is None else idle * 60.0,
    )


def holds_against(*, project: str, start: datetime, end: datetime) -> tuple[Hold, ...]:
    """Other projects' reservation windows overlapping [start, end), as holds on the devices
    each sets aside (chosen as the pass chooses them, ``scheduler.holds.choose_devices``): an
    advance reservation of ``project`` is placed around them."""
    lo, hi = to_epoch(start), to_epoch(end)
    rules = [
        hold_rule(r)
        for r in ProjectReservation.objects.filter(Q(weekly=True) | Q(end__gt=start))
        .filter(start__lt=end)
        .exclude(project__slug=project)
        .select_related("project")
        .prefetch_related("nodes")
        .order_by("start", "id")[:MAX_RULES]
    ]
    windows = [(rule, w) for rule in rules for w in occurrences(rule, lo, hi)]
    if not windows:
        return ()
    devices, allocations = _inventory(start=min(w[0] for _, w in windows), end=hi)
    now = to_epoch(timezone.now())
    out = []
    for rule, (w_start, w_end) in windows:
        ids = choose_devices(rule, devices, allocations, w_start, w_end)
        if rule.idle_release_s is not None and now >= w_start + rule.idle_release_s:
            ids = tuple(claimed(rule.project, ids, allocations, w_start, w_end))
        out += [Hold(int(d.split(":")[1]), None, w_start, w_end, 1.0, 0) for d in ids]
    return tuple(out)


def _inventory(*, start: float, end: float):
    """The whole GPUs and the live allocations overlapping [start, end), as the scheduler names
    them (``gpu:<pk>``, ``mig:<pk>``; the snapshot builder's ids)."""
    devices = tuple(
        scheduler.Device(id=f"gpu:{pk}", node=hostname, model=model)
        for pk, hostname, model in inventory.gpus_bookable().values_list(
            "pk", "node__hostname", "model"
        )
    )
    grouped: dict[int, list] = {}
    rows = Allocation.objects.filter(
        live=True, start__lt=from_epoch(end), end__gt=from_epoch(start)
    ).values_list(
        "booking_id", "gpu_id", "mig_instance_id", "start", "end", "booking__project__slug"
    )
    for row in rows:
        grouped.setdefault(row[0], []).append(row)
    allocations = tuple(
        scheduler.Allocation(
            booking_id=str(booking_id),
            device_ids=tuple(f"mig:{r[2]}" if r[2] else f"gpu:{r[1]}" for r in group),
            start=min(to_epoch(r[3]) for r in group),
            end=max(to_epoch(r[4]) for r in group),
            user="",
            project=group[0][5],
        )
        for booking_id, group in grouped.items()
    )
    return devices, allocations
