"""Inventory selectors: which devices exist, which are bookable, which are free in a window."""

from datetime import datetime

from django.db.models import Count, QuerySet

import scheduler
from portal.models import Allocation, Gpu, MigInstance, Node, mig_fraction


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


def admission_devices() -> tuple[scheduler.Device, ...]:
    """The inventory as the admission check needs it, from two grouped counts: per node, its
    whole GPUs by model and its MIG instances by model and profile. Down nodes count too: a
    request that fits only once a node is back is queued (reason node_down), not refused."""
    whole = Gpu.objects.filter(mig_mode=False).values_list("node_id", "model")
    migs = MigInstance.objects.filter(gpu__mig_mode=True).values_list(
        "gpu__node_id", "gpu__model", "profile", "slices"
    )
    devices = []
    for node, model, count in whole.annotate(n=Count("id")).order_by():
        devices += [
            scheduler.Device(f"gpu:{node}/{model}/{i}", str(node), model) for i in range(count)
        ]
    for node, model, profile, slices, count in migs.annotate(n=Count("id")).order_by():
        devices += [
            scheduler.Device(
                f"mig:{node}/{model}/{profile}/{i}", str(node), model, profile, mig_fraction(slices)
            )
            for i in range(count)
        ]
    return tuple(devices)


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


def _held_now(now: datetime) -> QuerySet:
    return Allocation.objects.filter(live=True, start__lte=now, end__gt=now)


def gpus_free_now(gpus: QuerySet, *, now: datetime) -> QuerySet:
    """Of `gpus`, the whole GPUs bookable and held by no booking now (on an up node)."""
    held = _held_now(now).values("gpu_id")
    return gpus.filter(node__state=Node.State.UP, mig_mode=False).exclude(id__in=held)


def mig_instances_free_now(instances: QuerySet, *, now: datetime) -> QuerySet:
    """Of `instances`, the MIG instances held by no booking now (on an up node)."""
    held = _held_now(now)
    return instances.filter(gpu__node__state=Node.State.UP).exclude(
        id__in=held.filter(mig_instance__isnull=False).values("mig_instance_id")
    )
