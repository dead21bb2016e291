"""CPU cores and host memory booked with GPUs: consumables of each node (docs/scheduling.md).

A node's capacity (``State.node_resources``, ``NodeResources``) is the cores a job may use (the
site-reserved ones taken off by its agent) and its host memory. A booking takes, on each node it
holds devices of, what ``node_demand`` says: the cores and memory it asked for per node, or the
site default per GPU-equivalent, or (no default) the node's share in proportion to the
GPU-equivalents it holds there (a MIG slice or a fraction of a shared GPU its fraction of one).
Every path (the allocator's phases, the agent's limits, accounting, the pages) reads a
booking's cores and memory on a node through ``node_demand``: one rule, one owner.

A node absent from ``State.node_resources`` counts neither (an older agent that reports none).
Fair share charges by the dominant resource (``billing_equivalents``: Slurm's TRES billing with
MAX, the dominant-resource fairness of DRF expressed in GPU-equivalents).
"""

from __future__ import annotations

from scheduler.types import NodeResources, Policy


def node_demand(
    cpus: int | None,
    memory_mib: int | None,
    equivalents: float,
    capacity: NodeResources,
    policy: Policy,
) -> tuple[int, int]:
    """(cores, memory MiB) a booking holds on a node where it holds ``equivalents``
    GPU-equivalents: what it asked (per node), else the site default per GPU-equivalent
    (``Policy.default_cpus_per_gpu``, ``Policy.default_memory_mib_per_gpu``), else
    the node's share in proportion (rounded down, at least one core and one MiB)."""
    if cpus is None:
        if policy.default_cpus_per_gpu is not None:
            cpus = max(1, int(policy.default_cpus_per_gpu * equivalents + 1e-9))
        else:
            cpus = max(1, int(capacity.cpus * equivalents / max(capacity.gpus, 1) + 1e-9))
    if memory_mib is None:
        if policy.default_memory_mib_per_gpu is not None:
            memory_mib = max(1, int(policy.default_memory_mib_per_gpu * equivalents + 1e-9))
        else:
            share = capacity.memory_mib * equivalents / max(capacity.gpus, 1)
            memory_mib = max(1, int(share + 1e-9))
    return cpus, memory_mib


def total_demand(demands) -> tuple[int, int]:
    """(cores, memory MiB) summed over a booking's nodes (``node_demand`` of each): what its
    limits of cores and memory count (``Quota.max_cpus``, ``Quota.max_memory_mib``)."""
    return sum(d[0] for d in demands), sum(d[1] for d in demands)


def billing_equivalents(
    gpu_equivalents: float, cpus: float, memory_mib: float, site: NodeResources
) -> float:
    """GPU-equivalents fair share charges for holding these at once: the largest of the GPU,
    core and memory shares of the site (``site``: its totals), in GPU-equivalents of the site.
    A site with no cores or memory known charges the GPUs alone."""
    gpus = max(site.gpus, 1)
    dominant = gpu_equivalents
    if site.cpus > 0:
        dominant = max(dominant, cpus * gpus / site.cpus)
    if site.memory_mib > 0:
        dominant = max(dominant, memory_mib * gpus / site.memory_mib)
    return dominant
