"""Inventory selectors: which devices exist, which are bookable, which are free in a window.

`gpus_bookable` and `mig_instances_bookable` are the one rule of what may be offered or planned
on: live (not retired) devices, whole GPUs only out of MIG mode, MIG instances only of GPUs in
MIG mode. Everything that offers or plans devices starts from them; pages that show history
(a booking's devices, accounting) read the rows as they are, retired ones included.
"""

from collections import defaultdict
from datetime import datetime
from functools import lru_cache

from django.db.models import Count, Max, QuerySet

import scheduler
from portal.models import Allocation, Gpu, MigInstance, Node, mig_fraction
from portal.models.inventory import runtimes_of
from scheduler.topology import describe


def gpus_live() -> QuerySet:
    """GPUs that their agents report now (not retired), in MIG mode or not: what the overview
    lists, GPUs in MIG mode with their bookable slices under them."""
    return Gpu.objects.filter(retired_at__isnull=True)


def gpus_bookable() -> QuerySet:
    """Whole GPUs that may be offered: live and not in MIG mode (on any node; callers that
    need an up node filter on it)."""
    return gpus_live().filter(mig_mode=False)


def mig_instances_bookable() -> QuerySet:
    """MIG instances that may be offered: live, of a live GPU in MIG mode."""
    return MigInstance.objects.filter(
        retired_at__isnull=True, gpu__retired_at__isnull=True, gpu__mig_mode=True
    )


def gpus_shared() -> QuerySet:
    """Whole GPUs in sharing mode that may be offered: to fractional bookings only."""
    return gpus_bookable().filter(sharing=Gpu.Sharing.SHARED)


def shared_gpu_memory(*, gpu_model: str = "") -> int | None:
    """The most memory (MiB) of a bookable shared GPU (of ``gpu_model``); None: none shared."""
    qs = gpus_shared()
    if gpu_model:
        qs = qs.filter(model=gpu_model)
    return qs.aggregate(most=Max("memory_mib"))["most"]


def gpu_nvlink_peers(*, gpu: Gpu) -> list[Gpu]:
    """The live GPUs of its node that it reported an NVLink to (peers are named by index)."""
    peers = gpu.nvlink_peers or []
    return list(gpus_live().filter(node_id=gpu.node_id, index__in=peers).order_by("index"))


def gpus_topology_text(gpus: list[Gpu]) -> str:
    """How these whole GPUs are connected, node by node, in the scheduler's words
    (``scheduler.topology.describe``): "4 GPUs, fully NVLink-connected, NUMA 0"; "" where no GPU
    reports topology or a node holds one of them. The GPUs' nodes should be selected with them."""
    by_node: dict[str, list[Gpu]] = defaultdict(list)
    for gpu in gpus:
        by_node[gpu.node.hostname].append(gpu)
    parts = []
    for hostname, members in sorted(by_node.items()):
        if not any(g.nvlink_peers or g.numa_node is not None for g in members):
            continue
        links = {g.index: tuple(g.nvlink_peers or ()) for g in members}
        text = describe([g.index for g in members], links, {g.index: g.numa_node for g in members})
        if text:
            parts.append(f"{hostname}: {text}" if len(by_node) > 1 else text)
    return "; ".join(parts)


def gpu_models() -> list[str]:
    """The models of the bookable whole GPUs, each once (one row per model from the database)."""
    return sorted(gpus_bookable().order_by().values_list("model", flat=True).distinct())


def mig_gpu_models() -> list[str]:
    """Models of the GPUs that hold bookable MIG instances."""
    return sorted(
        mig_instances_bookable().order_by().values_list("gpu__model", flat=True).distinct()
    )


def site_gpu_models() -> list[str]:
    """Every model of the bookable inventory, whole GPUs and GPUs in MIG mode, each once."""
    return sorted(set(gpu_models()) | set(mig_gpu_models()))


def mig_profiles(*, gpu_model: str = "") -> list[str]:
    qs = mig_instances_bookable()
    if gpu_model:
        qs = qs.filter(gpu__model=gpu_model)
    return sorted(qs.order_by().values_list("profile", flat=True).distinct())


def admission_devices() -> tuple[scheduler.Device, ...]:
    """The inventory as the admission check needs it, from two grouped counts: per node, its
    whole GPUs by model and its MIG instances by model and profile. Down nodes count too: a
    request that fits only once a node is back is queued (reason node_down), not refused."""
    whole = gpus_bookable().values_list("node_id", "model", "sharing", "memory_mib")
    migs = mig_instances_bookable().values_list("gpu__node_id", "gpu__model", "profile", "slices")
    counts = (
        tuple(whole.annotate(n=Count("id")).order_by()),
        tuple(migs.annotate(n=Count("id")).order_by()),
    )
    return _admission_devices(counts)


@lru_cache(maxsize=4)
def _admission_devices(counts: tuple[tuple, tuple]) -> tuple[scheduler.Device, ...]:
    # The counts are the whole input: the devices are built again only when they change (a
    # thousand dataclasses a submission otherwise).
    whole, migs = counts
    devices = []
    for node, model, sharing, memory, count in whole:
        shared = sharing == Gpu.Sharing.SHARED
        kind = f"shared/{memory}" if shared else "whole"
        devices += [
            scheduler.Device(
                f"gpu:{node}/{model}/{kind}/{i}", str(node), model, shared=shared, memory_mib=memory
            )
            for i in range(count)
        ]
    for node, model, profile, slices, count in migs:
        devices += [
            scheduler.Device(
                f"mig:{node}/{model}/{profile}/{i}", str(node), model, profile, mig_fraction(slices)
            )
            for i in range(count)
        ]
    return tuple(devices)


def _devices_like(gpu_model: str, mig_profile: str) -> tuple[QuerySet, str]:
    """Bookable devices of the kind a request asks for, and the name of their node's id."""
    if mig_profile:
        devices = mig_instances_bookable().filter(profile=mig_profile)
        node, model = "gpu__node_id", "gpu__model"
    else:
        devices, node, model = gpus_bookable(), "node_id", "model"
    if gpu_model:
        devices = devices.filter(**{model: gpu_model})
    return devices, node


def candidate_node_ids(*, gpu_model: str = "", mig_profile: str = "") -> list[int]:
    """Up nodes that could hold the request at all: the rows the booking path locks."""
    devices, node = _devices_like(gpu_model, mig_profile)
    up = Node.objects.filter(state=Node.State.UP).values("id")
    return sorted(set(devices.filter(**{f"{node}__in": up}).values_list(node, flat=True)))


def node_container_runtimes(
    *, gpu_model: str = "", mig_profile: str = ""
) -> dict[str, tuple[str, ...]]:
    """The container runtimes of each node that has devices such a request could get (up or
    not: a node down for a moment still counts), by hostname."""
    devices, node = _devices_like(gpu_model, mig_profile)
    nodes = Node.objects.filter(pk__in=devices.values(node)).order_by("hostname")
    rows = nodes.values_list("hostname", "container_runtimes")
    return {hostname: runtimes_of(text) for hostname, text in rows}


def node_ids_with_runtime(runtimes: tuple[str, ...]) -> list[int]:
    """Nodes whose agent reported one of these container runtimes."""
    rows = Node.objects.exclude(container_runtimes="").values_list("pk", "container_runtimes")
    return [pk for pk, text in rows if set(runtimes_of(text)) & set(runtimes)]


def _held_now(now: datetime) -> QuerySet:
    return Allocation.objects.filter(live=True, start__lte=now, end__gt=now)


def gpus_free_now(gpus: QuerySet, *, now: datetime) -> QuerySet:
    """Of `gpus`, the whole GPUs bookable and held by no booking now (on an up node)."""
    held = _held_now(now).values("gpu_id")
    bookable = (gpus & gpus_bookable()).filter(node__state=Node.State.UP)
    return bookable.exclude(id__in=held)


def mig_instances_free_now(instances: QuerySet, *, now: datetime) -> QuerySet:
    """Of `instances`, the MIG instances held by no booking now (on an up node)."""
    held = _held_now(now)
    bookable = instances & mig_instances_bookable()
    return bookable.filter(gpu__node__state=Node.State.UP).exclude(
        id__in=held.filter(mig_instance__isnull=False).values("mig_instance_id")
    )
