"""Stranded GPU capacity: the fragmentation measure of the FGD paper (Weng et al., ATC'23), as
its simulator computes it (kubernetes-scheduler-simulator, ``NodeGpuShareFragAmount``).

A node's free capacity is *fragmented for a task* when that task cannot use it:

- if the node cannot host the task at all (fewer than ``gpus`` of its GPUs each have at least
  ``fraction`` free), every free bit of GPU on the node is a fragment for it;
- if it can, the free capacity of each GPU that has less than ``fraction`` free is a fragment
  (a GPU with 0.3 free is useless to a 0.5 task and, with ``fraction`` 1, to any whole-GPU task).

The *typical workload* is the mix of task shapes the cluster serves, each with its popularity
(share of tasks, summing to 1). A node's fragmentation is the popularity-weighted mean of its
fragments over the typical workload, the cluster's is the sum over its nodes: the free GPU
capacity that a task drawn from the typical workload is expected not to be able to use. The paper
also counts tasks that lack CPU; traces here carry GPU demand only, so the GPU dimension alone is
measured. Capacities are GPU-equivalents: 1.0 is a whole GPU.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence

# Free capacity within this of a task's fraction still fits it (fractions are sums of floats).
EPSILON = 1e-9

Shape = tuple[int, float]  # (GPUs, fraction of each): (1, 0.25) a quarter GPU, (4, 1.0) 4 GPUs


def node_fragment(free: Sequence[float], gpus: int, fraction: float) -> float:
    """The free capacity of one node (``free``: each GPU's free fraction) that a task of
    ``gpus`` GPUs of ``fraction`` each cannot use."""
    usable = sum(1 for left in free if left >= fraction - EPSILON)
    if usable < gpus:
        return sum(free)
    return sum(left for left in free if left < fraction - EPSILON)


def node_fragmentation(free: Sequence[float], workload: Sequence[tuple[Shape, float]]) -> float:
    """One node's expected fragment over the typical workload ((shape, popularity) pairs)."""
    if not any(left > EPSILON for left in free):
        return 0.0
    return sum(p * node_fragment(free, gpus, fraction) for (gpus, fraction), p in workload)


def fragmentation(
    nodes: Iterable[Sequence[float]], workload: Sequence[tuple[Shape, float]]
) -> float:
    """The cluster's stranded capacity in GPU-equivalents: the sum of its nodes' fragmentation."""
    return sum(node_fragmentation(free, workload) for free in nodes)


def typical_workload(shapes: Iterable[Shape]) -> tuple[tuple[Shape, float], ...]:
    """The typical workload of a list of task shapes: each distinct shape with its share of the
    tasks, most popular first (ties by shape). Raises ValueError on an empty list."""
    counts = Counter((int(gpus), round(float(fraction), 6)) for gpus, fraction in shapes)
    total = sum(counts.values())
    if not total:
        raise ValueError("a typical workload needs at least one task")
    ordered = sorted(counts.items(), key=lambda item: (-item[1], item[0]))
    return tuple((shape, count / total) for shape, count in ordered)
