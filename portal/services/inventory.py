"""Inventory selectors: which devices exist, which are bookable, which are free in a window."""

from dataclasses import dataclass

from django.db.models import Count

from portal.models import Gpu, MigInstance, Node


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
