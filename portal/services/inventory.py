"""Inventory selectors: which devices exist, which are bookable, which are free in a window."""

from dataclasses import dataclass
from datetime import datetime

from django.db.models import Count, Q

from portal.models import Allocation, Gpu, MigInstance, Node
from portal.services.placement import FreeDevice, place_gpus, place_mig


@dataclass(frozen=True)
class Capacity:
    """How much of a device kind the cluster has: in all, and the most on one node."""

    total: int
    largest_node: int


def gpu_models() -> list[str]:
    return sorted(set(Gpu.objects.filter(mig_mode=False).values_list("model", flat=True)))


def mig_gpu_models() -> list[str]:
    """Models of the GPUs that hold MIG instances."""
    return sorted(set(MigInstance.objects.values_list("gpu__model", flat=True)))


def mig_profiles(*, gpu_model: str = "") -> list[str]:
    qs = MigInstance.objects.all()
    if gpu_model:
        qs = qs.filter(gpu__model=gpu_model)
    return sorted(set(qs.values_list("profile", flat=True)))


def mig_profile_slices(profile: str) -> int | None:
    return MigInstance.objects.filter(profile=profile).values_list("slices", flat=True).first()


def whole_gpu_capacity(*, gpu_model: str = "", allowed_models: tuple[str, ...] = ()) -> Capacity:
    """Whole GPUs (MIG off) of the model in the inventory, down or draining nodes included.

    A request that fits only once a node is back is queued (reason node_down), not refused.
    """
    qs = Gpu.objects.filter(mig_mode=False)
    qs = _model_filter(qs, "model", gpu_model, allowed_models)
    per_node = list(qs.values("node").annotate(n=Count("id")).values_list("n", flat=True))
    return Capacity(total=sum(per_node), largest_node=max(per_node, default=0))


def _model_filter(qs, field: str, gpu_model: str, allowed_models: tuple[str, ...]):
    if gpu_model:
        return qs.filter(**{field: gpu_model})
    if allowed_models:
        return qs.filter(**{f"{field}__in": allowed_models})
    return qs


def free_devices(
    *,
    start: datetime,
    end: datetime,
    gpu_model: str = "",
    allowed_models: tuple[str, ...] = (),
    mig_profile: str = "",
    node_ids: list[int] | None = None,
) -> list[FreeDevice]:
    """Bookable devices of up nodes with no live allocation overlapping [start, end)."""
    busy = Allocation.objects.filter(live=True, start__lt=end, end__gt=start)
    up = Q(node__state=Node.State.UP)
    if mig_profile:
        qs = MigInstance.objects.filter(profile=mig_profile, gpu__mig_mode=True).filter(
            Q(gpu__node__state=Node.State.UP)
        )
        qs = _model_filter(qs, "gpu__model", gpu_model, allowed_models)
        if node_ids is not None:
            qs = qs.filter(gpu__node_id__in=node_ids)
        held = _held_slots(busy.filter(gpu__in=qs.values("gpu_id")))
        return [
            FreeDevice(
                node_id=m.gpu.node_id,
                gpu_id=m.gpu_id,
                mig_id=m.id,
                fraction=m.fraction,
                node_gpus=1,
            )
            for m in qs.select_related("gpu")
            if not _slice_taken(m, held.get(m.gpu_id, ()))
        ]
    qs = _model_filter(Gpu.objects.filter(up, mig_mode=False), "model", gpu_model, allowed_models)
    if node_ids is not None:
        qs = qs.filter(node_id__in=node_ids)
    node_sizes = dict(qs.values("node").annotate(n=Count("id")).values_list("node", "n"))
    # Plain values: a site has thousands of GPUs and this runs inside the booking transaction.
    # Any live allocation on a GPU, MIG slices of a layout it has left included, keeps it busy.
    qs = qs.exclude(id__in=busy.values("gpu_id"))
    return [
        FreeDevice(
            node_id=node_id,
            gpu_id=gpu_id,
            mig_id=None,
            fraction=1.0,
            node_gpus=node_sizes[node_id],
        )
        for gpu_id, node_id in qs.values_list("id", "node_id")
    ]


def _held_slots(busy) -> dict[int, list[tuple[int | None, int | None, int | None]]]:
    """Per GPU, (MIG instance or None for the whole GPU, first slot, end slot) held."""
    held: dict[int, list[tuple[int | None, int | None, int | None]]] = {}
    rows = busy.values_list("gpu_id", "mig_instance_id", "slot_start", "slot_end")
    for gpu_id, mig_id, slot_start, slot_end in rows.order_by():
        held.setdefault(gpu_id, []).append((mig_id, slot_start, slot_end))
    return held


def _slice_taken(mig: MigInstance, held) -> bool:
    # The whole GPU, the instance itself, or (PostgreSQL, where the database records the
    # slots) another layout's instance on the same compute slices.
    first, end = mig.placement_start, mig.placement_start + mig.slices
    return any(
        mig_id is None
        or mig_id == mig.id
        or (slot_start is not None and slot_start < end and first < slot_end)
        for mig_id, slot_start, slot_end in held
    )


def busy_slices_by_gpu(*, start: datetime, end: datetime) -> dict[int, float]:
    """MIG slices (as GPU fractions) already held per GPU during the window, for packing."""
    totals: dict[int, float] = {}
    for gpu_id, fraction in Allocation.objects.filter(
        live=True, mig_instance__isnull=False, start__lt=end, end__gt=start
    ).values_list("gpu_id", "fraction"):
        totals[gpu_id] = totals.get(gpu_id, 0.0) + fraction
    return totals


def candidate_node_ids(*, gpu_model: str = "", mig_profile: str = "") -> list[int]:
    """Up nodes that could hold the request at all: the rows the booking path locks."""
    qs = Node.objects.filter(state=Node.State.UP)
    if mig_profile:
        qs = qs.filter(gpus__mig_instances__profile=mig_profile)
    else:
        qs = qs.filter(gpus__mig_mode=False)
    if gpu_model:
        qs = qs.filter(gpus__model=gpu_model)
    return sorted(set(qs.values_list("id", flat=True)))


def devices_for_window(
    *,
    start: datetime,
    end: datetime,
    gpus: int,
    mig_profile: str = "",
    gpu_model: str = "",
    allowed_models: tuple[str, ...] = (),
) -> tuple[list[FreeDevice] | None, int]:
    """Devices for a fixed window by the placement rules, or None; and how many matched free."""
    free = free_devices(
        start=start,
        end=end,
        gpu_model=gpu_model,
        allowed_models=allowed_models,
        mig_profile=mig_profile,
    )
    if mig_profile:
        chosen = place_mig(free, busy_slices_by_gpu(start=start, end=end))
        return ([chosen] if chosen else None), len(free)
    return place_gpus(free, gpus), len(free)
