"""Reservation placement, read from the database and decided by ``scheduler.reserve``.

The callers hold the node locks; this reads the candidate devices (bookable ones, see
``inventory.gpus_bookable``) on up nodes and the live
allocations that overlap the window on their GPUs, asks the pure rule, and hands back its slots.
"""

from dataclasses import replace
from datetime import datetime

from portal.models import Allocation, Gpu, Node, mig_fraction
from portal.services.core.clock import from_epoch, to_epoch
from portal.services.inventory import selectors as inventory
from portal.services.inventory.mig_layouts import gpus_changing_before
from portal.services.inventory.resources import window_hosts
from portal.services.inventory.windows import window_holds
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
    gpu_fraction: float | None = None,
    gpu_memory_mib: int | None = None,
    cpus: int | None = None,
    memory_mib: int | None = None,
    project_holds: tuple[Hold, ...] = (),
) -> tuple[list[Slot] | None, int, str | None]:
    """Devices for a fixed window by the placement rules, or None; how many matched free; and
    "cpus" or "memory" where the GPUs were free but that was short on their nodes. With
    ``runtimes`` (a booking in a container) only nodes with one of them count. With
    ``gpu_fraction`` / ``gpu_memory_mib``, a fraction of one shared GPU (its slot says what it
    holds: ``fraction`` and ``held_mib``). ``cpus`` / ``memory_mib``: per node (None: the
    site's default). ``project_holds``: other projects' reservations in the way, as holds (the
    caller's)."""
    share = (gpu_fraction, gpu_memory_mib)
    wanted, slots, gpu_ids = _wanted(
        start, end, gpus, mig_profile, gpu_model, mixed_models, allowed_models, runtimes, share
    )
    wanted = replace(wanted, cpus=cpus, memory_mib=memory_mib)
    holds = holds_on(gpu_ids=gpu_ids, start=start, end=end)
    holds += window_holds(gpu_ids=gpu_ids, start=start, end=end)
    holds += tuple(project_holds)
    hosts = window_hosts(start, end, {slot.node for slot in slots})
    placement = reserve(wanted, slots, holds, hosts)
    return (list(placement.slots) or None), placement.free, placement.short


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
    gpu_fraction: float | None = None,
    gpu_memory_mib: int | None = None,
    cpus: int | None = None,
    memory_mib: int | None = None,
    project_holds: tuple[Hold, ...] = (),
) -> datetime | None:
    """The earliest start from ``start`` to ``until`` at which a window as long as [start, end)
    gets devices (and cores and memory) by the same rules (``scheduler.reserve.next_window``),
    or None."""
    share = (gpu_fraction, gpu_memory_mib)
    wanted, slots, gpu_ids = _wanted(
        start, end, gpus, mig_profile, gpu_model, mixed_models, allowed_models, runtimes, share
    )
    wanted = replace(wanted, cpus=cpus, memory_mib=memory_mib)
    last = until + (end - start)
    holds = holds_on(gpu_ids=gpu_ids, start=start, end=last)
    holds += window_holds(gpu_ids=gpu_ids, start=start, end=last)
    holds += tuple(project_holds)
    hosts = window_hosts(start, last, {slot.node for slot in slots})
    found = next_window(wanted, slots, holds, until=to_epoch(until), hosts=hosts)
    return None if found is None else from_epoch(found)


def _wanted(
    start, end, gpus, mig_profile, gpu_model, mixed_models, allowed_models, runtimes, share
):
    """The request as the rule takes it, the candidate slots, and their GPUs' ids (a subquery:
    a thousand ids spelled out cost more than the read)."""
    fractional = share != (None, None)
    candidates = _candidates(
        mig_profile=mig_profile,
        gpu_model=gpu_model,
        allowed_models=allowed_models,
        shared=fractional,
    )
    if mig_profile:  # a MIG layout change planned before the window ends takes these slices
        candidates = candidates.exclude(gpu_id__in=gpus_changing_before(end))
    slots = _slots(candidates, mig_profile=mig_profile, shared=fractional)
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
        gpu_fraction=share[0],
        gpu_memory_mib=share[1],
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
        "gpu_id",
        "mig_instance_id",
        "start",
        "end",
        "fraction",
        "id",
        "slot_start",
        "slot_end",
        "share",
        "gpu_memory_mib",
    )
    return tuple(
        Hold(g, m, to_epoch(s), to_epoch(e), f, i, _compute(first, end), share, memory)
        for g, m, s, e, f, i, first, end, share, memory in rows
    )


def _compute(first: int | None, end: int | None) -> tuple[int, int] | None:
    # The database records the compute slices an allocation holds (PostgreSQL; None elsewhere).
    return None if first is None or end is None else (first, end)


def _candidates(
    *, mig_profile: str, gpu_model: str, allowed_models: tuple[str, ...], shared: bool = False
):
    """The bookable devices of the kind asked for on up nodes: MIG instances of the profile,
    shared GPUs (for a fraction), or whole exclusive GPUs."""
    if mig_profile:
        qs = inventory.mig_instances_bookable().filter(
            profile=mig_profile, gpu__node__state=Node.State.UP
        )
        return _model_filter(qs, "gpu__model", gpu_model, allowed_models)
    # A shared GPU holds fractions only, an exclusive one no fraction.
    sharing = Gpu.Sharing.SHARED if shared else Gpu.Sharing.EXCLUSIVE
    qs = inventory.gpus_bookable().filter(node__state=Node.State.UP, sharing=sharing)
    return _model_filter(qs, "model", gpu_model, allowed_models)


def _slots(qs, *, mig_profile: str, shared: bool = False) -> tuple[Slot, ...]:
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
    if shared:
        rows = qs.values_list("node_id", "id", "model", "memory_mib")
        return tuple(
            Slot(node, gpu, None, model, shared=True, memory_mib=memory)
            for node, gpu, model, memory in rows
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
