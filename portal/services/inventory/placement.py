"""Reservation placement, read from the database and decided by ``scheduler.reserve``.

The callers hold the node locks; this reads the candidate devices (bookable ones, see
``inventory.gpus_bookable``) on up nodes and the live
allocations that overlap the window on their GPUs, asks the pure rule, and hands back its slots.
"""

from datetime import datetime

from portal.models import Allocation, Node, mig_fraction
from portal.services.core.clock import from_epoch, to_epoch
from portal.services.inventory import selectors as inventory
from scheduler.reserve import Hold, Slot, Wanted, clashes, next_window, reserve


def devices_for_window(
    *,
    start: datetime,
    end: datetime,
    gpus: int,
    mig_profile: str = "",
    gpu_model: str = "",
    mixed_models: bool = False,
    allowed_models: tuple[str, ...] = (),
    runtimes: tuple[str, ...] = (),
) -> tuple[list[Slot] | None, int]:
    """Devices for a fixed window by the placement rules, or None; and how many matched free.
    With ``runtimes`` (a booking in a container) only nodes with one of them count."""
    wanted, slots, gpu_ids = _wanted(
        start, end, gpus, mig_profile, gpu_model, mixed_models, allowed_models, runtimes
    )
    placement = reserve(wanted, slots, holds_on(gpu_ids=gpu_ids, start=start, end=end))
    return (list(placement.slots) or None), placement.free


def next_window_start(
    *,
    start: datetime,
    end: datetime,
    until: datetime,
    gpus: int,
    mig_profile: str = "",
    gpu_model: str = "",
    mixed_models: bool = False,
    allowed_models: tuple[str, ...] = (),
    runtimes: tuple[str, ...] = (),
) -> datetime | None:
    """The earliest start from ``start`` to ``until`` at which a window as long as [start, end)
    gets devices by the same rules (``scheduler.reserve.next_window``), or None."""
    wanted, slots, gpu_ids = _wanted(
        start, end, gpus, mig_profile, gpu_model, mixed_models, allowed_models, runtimes
    )
    holds = holds_on(gpu_ids=gpu_ids, start=start, end=until + (end - start))
    found = next_window(wanted, slots, holds, until=to_epoch(until))
    return None if found is None else from_epoch(found)


def _wanted(start, end, gpus, mig_profile, gpu_model, mixed_models, allowed_models, runtimes):
    """The request as the rule takes it, the candidate slots, and their GPUs' ids (a subquery:
    a thousand ids spelled out cost more than the read)."""
    candidates = _candidates(
        mig_profile=mig_profile, gpu_model=gpu_model, allowed_models=allowed_models
    )
    slots = _slots(candidates, mig_profile=mig_profile)
    if runtimes:
        able = set(inventory.node_ids_with_runtime(runtimes))
        slots = tuple(slot for slot in slots if slot.node in able)
    wanted = Wanted(
        gpus=gpus,
        start=to_epoch(start),
        end=to_epoch(end),
        mig_profile=mig_profile or None,
        gpu_model=gpu_model or None,
        mixed_models=mixed_models,
    )
    return wanted, slots, candidates.values("gpu_id" if mig_profile else "id")


def first_clash(allocations: list[Allocation], *, start: datetime, end: datetime):
    """The earliest live allocation of another booking on these allocations' devices within
    [start, end) (what keeps an extension from fitting), or None."""
    mine = tuple(Slot(0, a.gpu_id, a.mig_instance_id) for a in allocations)
    holds = holds_on(
        gpu_ids={a.gpu_id for a in allocations},
        start=start,
        end=end,
        exclude_booking=allocations[0].booking_id,
    )
    found = clashes(mine, holds, to_epoch(start), to_epoch(end))
    if not found:
        return None
    return Allocation.objects.select_related("gpu", "mig_instance").get(pk=found[0].id)


def holds_on(
    *, gpu_ids, start: datetime, end: datetime, exclude_booking: int | None = None
) -> tuple[Hold, ...]:
    """Live allocations on these GPUs (whole or MIG) that overlap [start, end); ``gpu_ids``
    is a collection of ids or a queryset of them."""
    qs = Allocation.objects.filter(live=True, start__lt=end, end__gt=start, gpu_id__in=gpu_ids)
    if exclude_booking is not None:
        qs = qs.exclude(booking_id=exclude_booking)
    rows = qs.values_list(
        "gpu_id", "mig_instance_id", "start", "end", "fraction", "id", "slot_start", "slot_end"
    )
    return tuple(
        Hold(g, m, to_epoch(s), to_epoch(e), f, i, _compute(first, end))
        for g, m, s, e, f, i, first, end in rows
    )


def _compute(first: int | None, end: int | None) -> tuple[int, int] | None:
    # The database records the compute slices an allocation holds (PostgreSQL; None elsewhere).
    return None if first is None or end is None else (first, end)


def _candidates(*, mig_profile: str, gpu_model: str, allowed_models: tuple[str, ...]):
    """The bookable devices of the kind asked for on up nodes: MIG instances of the profile,
    or whole GPUs."""
    if mig_profile:
        qs = inventory.mig_instances_bookable().filter(
            profile=mig_profile, gpu__node__state=Node.State.UP
        )
        return _model_filter(qs, "gpu__model", gpu_model, allowed_models)
    qs = inventory.gpus_bookable().filter(node__state=Node.State.UP)
    return _model_filter(qs, "model", gpu_model, allowed_models)


def _slots(qs, *, mig_profile: str) -> tuple[Slot, ...]:
    if mig_profile:
        rows = qs.values_list(
            "gpu__node_id", "gpu_id", "id", "gpu__model", "slices", "placement_start"
        )
        return tuple(
            Slot(
                node,
                gpu,
                mig,
                model,
                mig_profile,
                mig_fraction(slices),
                _compute(first, None if first is None else first + slices),
            )
            for node, gpu, mig, model, slices, first in rows
        )
    rows = list(
        qs.values_list(
            "node_id", "id", "model", "index", "numa_node", "nvlink_peers", "node__network_group"
        )
    )
    # NVLink peers are reported by index on their node; the rule names them by GPU id.
    slot = {(row[0], row[3]): row[1] for row in rows}
    return tuple(
        Slot(
            node,
            gpu,
            None,
            model,
            links=tuple(slot[node, p] for p in peers or () if (node, p) in slot),
            numa=numa,
            group=group,
        )
        for node, gpu, model, _, numa, peers, group in rows
    )


def _model_filter(qs, field: str, gpu_model: str, allowed_models: tuple[str, ...]):
    if gpu_model:
        return qs.filter(**{field: gpu_model})
    if allowed_models:
        return qs.filter(**{f"{field}__in": allowed_models})
    return qs
