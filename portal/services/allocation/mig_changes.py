"""MIG layout changes, the writes: staff ask for one (or the allocator proposes it,
MIG_AUTO_LAYOUT), the allocation pass plans and starts it, the node's register ends it
(docs/scheduling.md, "MIG layouts that change"). Each change of state records one fact
(MIG_LAYOUT_CHANGED) for after commit.
"""

from datetime import datetime

from django.conf import settings
from django.db import IntegrityError, transaction

from portal.errors import Conflict, InvalidState, NotAllowed, NotFound, ValidationFailed
from portal.models import Allocation, Booking, Gpu, MigLayoutChange
from portal.services.access import permissions
from portal.services.access.audit import SYSTEM, Source, audit_record
from portal.services.core.clock import from_epoch, to_epoch
from portal.services.core.outbox import fact_record
from portal.services.inventory.mig_layouts import (
    APPLY_TIMEOUT,
    MIG_LAYOUT_CHANGED,
    gpu_mig_layout,
    mig_layout_check,
)
from scheduler.mig_layout import mig_model, propose_layouts

State = MigLayoutChange.State


def mig_layout_request(
    *,
    gpu_id: int,
    instances,
    by=None,
    source: Source = SYSTEM,
    proposed: str = "",
    approved: bool = False,
) -> MigLayoutChange:
    """Ask for a new MIG layout on a live GPU (staff; ``proposed``: the allocator proposes it,
    saying why, and it waits for approval unless ``approved``, MIG_AUTO_LAYOUT=apply). 409 when
    the GPU has an open change already."""
    _check_allowed(by)
    gpu = Gpu.objects.select_related("node").filter(pk=gpu_id, retired_at__isnull=True).first()
    if gpu is None:
        raise NotFound(f"No live GPU {gpu_id}.")
    layout = mig_layout_check(gpu=gpu, instances=instances)
    previous = gpu_mig_layout(gpu=gpu)
    if layout == previous:
        raise ValidationFailed.field("instances", f"{gpu} has this layout already")
    try:
        with transaction.atomic():
            change = MigLayoutChange.objects.create(
                gpu=gpu,
                layout=layout,
                previous=previous,
                state=State.PROPOSED if proposed and not approved else State.REQUESTED,
                detail=proposed[:300],
                requested_by=by,
            )
            _changed(change, "requested")
            audit_record(
                action="gpu.mig_layout",
                actor=by,
                source=source,
                target=gpu,
                after={"layout": layout},
            )
    except IntegrityError:
        open_ = MigLayoutChange.objects.filter(gpu=gpu, state__in=MigLayoutChange.OPEN).first()
        where = f" (change {open_.pk}, {open_.state})" if open_ else ""
        raise Conflict(
            f"{gpu} has a MIG layout change under way{where}.",
            fields={"gpu": "a change is under way"},
        ) from None
    return change


def _check_allowed(by) -> None:
    # None: the site itself (the allocator's proposal, a setting that approves it).
    if by is not None and not permissions.can(by, "gpu.mig_layout"):
        raise NotAllowed("Only admins with the right to change GPUs may change MIG layouts.")


def mig_layout_approve(*, change_id: int, by=None) -> MigLayoutChange:
    """Approve a proposed change: it is planned from the next pass on."""
    _check_allowed(by)
    return _move(change_id, (State.PROPOSED,), State.REQUESTED, "approved", by=by)


def mig_layout_cancel(*, change_id: int, by=None) -> MigLayoutChange:
    """Cancel a change not yet applying (an agent may be creating the instances)."""
    _check_allowed(by)
    return _move(
        change_id,
        (State.PROPOSED, State.REQUESTED, State.PLANNED),
        State.CANCELLED,
        "cancelled",
        by=by,
    )


def _move(change_id: int, from_: tuple, to: str, why: str, *, by=None) -> MigLayoutChange:
    with transaction.atomic():
        moved = MigLayoutChange.objects.filter(pk=change_id, state__in=from_).update(state=to)
        change = MigLayoutChange.objects.filter(pk=change_id).first()
        if change is None:
            raise NotFound(f"No MIG layout change {change_id}.")
        if not moved:
            raise InvalidState(f"MIG layout change {change_id} is {change.state}: not {why}.")
        _changed(change, why)
        audit_record(
            action="gpu.mig_layout",
            actor=by,
            target=change.gpu,
            after={"change": change.pk, "state": to},
        )
    return change


def _changed(change: MigLayoutChange, what: str) -> None:
    fact_record(
        kind=MIG_LAYOUT_CHANGED,
        node_id=change.gpu.node_id,
        payload={"change": change.pk, "gpu": change.gpu_id, "what": what},
    )


def mig_layouts_propose(*, state, now: datetime) -> int:
    """MIG_AUTO_LAYOUT: record the allocator's proposals (scheduler.mig_layout.propose_layouts)
    for the profiles pending bookings have waited MIG_AUTO_LAYOUT_WAIT_S for, as proposals for
    staff to approve ("propose") or approved ("apply"). A profile with an open proposal already
    gets no other. Returns how many were recorded."""
    mode = settings.MIG_AUTO_LAYOUT
    if mode == "off":
        return 0
    pending = {r.mig_profile for r in state.pending if r.mig_profile}
    if not pending:
        return 0
    tables = {}
    for pk, model, memory in Gpu.objects.filter(retired_at__isnull=True, mig_mode=True).values_list(
        "pk", "model", "memory_mib"
    ):
        table = mig_model(model, memory)
        if table is not None:
            tables[f"gpu:{pk}"] = table
    proposals = propose_layouts(state, tables, wait_s=settings.MIG_AUTO_LAYOUT_WAIT_S)
    open_ = MigLayoutChange.objects.filter(state__in=MigLayoutChange.OPEN, requested_by=None)
    proposed = {
        item["profile"] for layout in open_.values_list("layout", flat=True) for item in layout
    }
    made = 0
    for proposal in proposals:
        if proposal.profiles[0] in proposed:
            continue  # one open proposal per profile
        reason = proposal.reason + (
            " (approved by MIG_AUTO_LAYOUT=apply)" if mode == "apply" else ""
        )
        try:
            mig_layout_request(
                gpu_id=int(proposal.gpu.split(":")[1]),
                instances=[{"profile": p} for p in proposal.profiles],
                proposed=reason,
                approved=mode == "apply",
            )
        except (ValidationFailed, Conflict, NotFound):
            continue  # the GPU changed since the snapshot: the next pass sees it as it is
        made += 1
    return made


def mig_changes_advance(*, times: dict[str, float], now: datetime) -> int:
    """The pass's step (``times``: scheduler.mig_layout.change_times of its snapshot): a change
    whose slices free up later is planned then; one whose slices are free now (and that no live
    allocation holds, whatever the snapshot predicted) starts applying: its node's agent is
    told. One applying past APPLY_TIMEOUT fails. Returns the changes that moved."""
    moved = 0
    for change in MigLayoutChange.objects.filter(state__in=MigLayoutChange.HOLDING).select_related(
        "gpu__node"
    ):
        at = times.get(f"gpu:{change.gpu_id}")
        if change.state == State.APPLYING:
            moved += _time_out(change, now)
        elif at is None:
            continue  # asked for after the snapshot: this pass's plan did not hold its slices
        elif at > to_epoch(now):
            moved += _plan(change, at)
        elif not _slices_held(change.gpu_id, now):
            moved += _start_applying(change, now)
    return moved


def _plan(change: MigLayoutChange, at: float) -> int:
    when = from_epoch(at)
    if change.state == State.PLANNED and change.planned_at == when:
        return 0
    with transaction.atomic():
        n = MigLayoutChange.objects.filter(pk=change.pk, state=change.state).update(
            state=State.PLANNED, planned_at=when
        )
        if n:
            change.planned_at = when
            _changed(change, "planned")
    return n


def _start_applying(change: MigLayoutChange, now: datetime) -> int:
    with transaction.atomic():
        n = MigLayoutChange.objects.filter(pk=change.pk, state=change.state).update(
            state=State.APPLYING, applying_since=now, planned_at=change.planned_at or now
        )
        if n:
            _changed(change, "applying")
    return n


def _time_out(change: MigLayoutChange, now: datetime) -> int:
    if change.applying_since is None or now - change.applying_since < APPLY_TIMEOUT:
        return 0
    return mig_change_finish(
        change_id=change.pk,
        ok=False,
        detail=f"the agent of {change.gpu.node} did not report the new layout in time",
        now=now,
    )


def _slices_held(gpu_id: int, now: datetime) -> bool:
    return Allocation.objects.filter(
        gpu_id=gpu_id,
        live=True,
        end__gt=now,
        booking__state__in=(Booking.State.ACTIVE, Booking.State.PLANNED),
    ).exists()


def mig_change_finish(*, change_id: int, ok: bool, detail: str, now: datetime) -> int:
    """End an applying change: done, or failed with the reason (compare-and-set: 0 when it was
    not applying)."""
    with transaction.atomic():
        n = MigLayoutChange.objects.filter(pk=change_id, state=State.APPLYING).update(
            state=State.DONE if ok else State.FAILED, detail=detail[:300], finished_at=now
        )
        if n:
            _changed(MigLayoutChange.objects.select_related("gpu").get(pk=change_id), "finished")
    return n
