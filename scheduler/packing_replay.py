"""The event loop of the packing replay (scheduler/packing.py) and the figures it keeps.

At each instant (an arrival or a departure) it ends the pods whose time is up, then asks the
placer where the waiting pods go (the ones just arrived and any that did not fit before, in
arrival order). After each instant it records the GPUs with at least one tenant, the nodes with
at least one, the capacity the pods alive asked for and the stranded capacity; figures are
time-weighted over the span from the first arrival to the last departure.

Stranded capacity is ``scheduler.fragmentation``'s measure per *pool*: the shared GPUs of a node
against the typical workload of fraction pods (the only ones they take), its exclusive GPUs
against the typical workload of whole-GPU pods. On a cluster without shared GPUs there is one
pool and a fraction pod counts as the whole GPU it holds (``pool_workloads``).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from scheduler.fragmentation import EPSILON, node_fragmentation, typical_workload
from scheduler.packing import Placed, Pod, fractional, free_capacity, sharing
from scheduler.types import Device

FIGURES = ("gpus", "shared_gpus", "demand", "stranded", "share")


@dataclass
class PackingResult:
    """Figures of one packing replay (capacities in GPU-equivalents)."""

    pods: int = 0
    skipped: int = 0  # wider than a node: never placed
    never_placed: int = 0  # still waiting when nothing else was left to happen
    waited: int = 0  # placed later than they arrived
    max_wait_s: float = 0.0
    span_s: float = 0.0
    peak_gpus_in_use: int = 0  # GPUs with at least one tenant
    mean_gpus_in_use: float = 0.0
    peak_shared_gpus_in_use: int = 0  # of them shared GPUs
    mean_shared_gpus_in_use: float = 0.0
    peak_nodes_in_use: int = 0
    mean_demand: float = 0.0  # capacity the pods alive asked for: the lower bound
    peak_demand: float = 0.0
    mean_stranded: float = 0.0  # scheduler.fragmentation over the pools' typical workloads
    max_stranded: float = 0.0
    mean_stranded_share: float = 0.0  # stranded / GPUs of the pools in use


def pool_workloads(pods: Iterable[Pod], shared: bool) -> dict[bool, tuple]:
    """The typical workload of each pool (True: shared GPUs, False: exclusive GPUs) from a pod
    list: on shared GPUs the fraction pods' shapes, on exclusive GPUs the others' (every pod's,
    a fraction as one whole GPU, without sharing). A pool with no pod in the list is left out."""
    by_pool: dict[bool, list] = {}
    for pod in pods:
        if fractional(pod, shared):
            by_pool.setdefault(True, []).append(pod.shape)
        else:
            by_pool.setdefault(False, []).append((pod.gpus, 1.0))
    return {pool: typical_workload(shapes) for pool, shapes in by_pool.items()}


class PackingReplay:
    """Replay ``pods`` on ``devices`` with ``placer`` (a ``FirstFit`` or ``AllocatorPlacer``);
    ``workloads`` as ``pool_workloads`` gives them."""

    def __init__(
        self, pods: Sequence[Pod], devices: Sequence[Device], placer, workloads: dict
    ) -> None:
        self.devices, self.placer, self.workloads = tuple(devices), placer, workloads
        self.shared = sharing(devices)
        self.pools: dict[tuple[str, bool], list[str]] = {}
        for device in self.devices:
            self.pools.setdefault((device.node, device.shared), []).append(device.id)
        widest = max((len(ids) for (_, shared), ids in self.pools.items() if not shared), default=0)
        self.pods = [pod for pod in pods if pod.gpus <= widest or fractional(pod, self.shared)]
        self.result = PackingResult(pods=len(self.pods), skipped=len(pods) - len(self.pods))
        self.alive: dict[str, Placed] = {}
        self.ends: list[tuple[float, str]] = []
        self._cache: dict[tuple, float] = {}

    def run(self) -> PackingResult:
        """Replay every pod; returns the figures."""
        arrivals, i, pending = self.pods, 0, []
        sums = dict.fromkeys(FIGURES, 0.0)
        first = last = arrivals[0].submit if arrivals else 0.0
        snapshot = self._snapshot()
        while i < len(arrivals) or self.ends:
            now = min(
                arrivals[i].submit if i < len(arrivals) else math.inf,
                self.ends[0][0] if self.ends else math.inf,
            )
            for key, value in zip(FIGURES, snapshot, strict=True):
                sums[key] += value * (now - last)
            last = now
            while self.ends and self.ends[0][0] <= now:
                del self.alive[heapq.heappop(self.ends)[1]]
            while i < len(arrivals) and arrivals[i].submit == now:
                pending.append(arrivals[i])
                i += 1
            if pending:
                pending = self._place(now, pending)
            snapshot = self._snapshot()
        return self._finish(sums, last - first, len(pending))

    def _finish(self, sums: dict, span: float, waiting: int) -> PackingResult:
        result = self.result
        result.never_placed, result.span_s = waiting, span
        if span > 0:
            result.mean_gpus_in_use = sums["gpus"] / span
            result.mean_shared_gpus_in_use = sums["shared_gpus"] / span
            result.mean_demand = sums["demand"] / span
            result.mean_stranded = sums["stranded"] / span
            result.mean_stranded_share = sums["share"] / span
        return result

    def _place(self, now: float, pending: list[Pod]) -> list[Pod]:
        chosen = self.placer.place(now, self.alive, pending)
        self._check(chosen, pending)
        waiting = []
        for pod in pending:
            device_ids = chosen.get(pod.pod_id)
            if not device_ids:
                waiting.append(pod)
                continue
            share = pod.fraction if fractional(pod, self.shared) else 1.0
            self.alive[pod.pod_id] = Placed(pod, tuple(device_ids), now, share)
            heapq.heappush(self.ends, (now + pod.duration, pod.pod_id))
            if now > pod.submit:
                self.result.waited += 1
                self.result.max_wait_s = max(self.result.max_wait_s, now - pod.submit)
        return waiting

    def _check(self, chosen: dict, pending: list[Pod]) -> None:
        """Refuse a placement that overfills a GPU or puts a pod in the wrong pool: the figures
        would count capacity that does not exist."""
        free = free_capacity(self.devices, self.alive)
        shared = {device.id: device.shared for device in self.devices}
        for pod in pending:
            device_ids = chosen.get(pod.pod_id) or ()
            frac = fractional(pod, self.shared)
            if device_ids and (len(device_ids) != pod.gpus or set(device_ids) - set(free)):
                raise RuntimeError(f"pod {pod.pod_id}: placed on {device_ids}")
            for device_id in device_ids:
                free[device_id] -= pod.fraction if frac else 1.0
                if free[device_id] < -EPSILON or shared[device_id] is not frac:
                    raise RuntimeError(f"pod {pod.pod_id}: {device_id} overfilled or wrong pool")

    def _snapshot(self) -> tuple[float, ...]:
        """The figures of ``FIGURES`` now; keeps the peaks."""
        free = free_capacity(self.devices, self.alive)
        used_gpus = used_shared = capacity = 0
        stranded, nodes = 0.0, set()
        for (node, shared), ids in self.pools.items():
            frees = tuple(sorted(round(max(free[d], 0.0), 6) for d in ids))
            used = sum(1 for left in frees if left < 1 - EPSILON)
            if used:
                nodes.add(node)
                used_gpus += used
                used_shared += used if shared else 0
                capacity += len(ids)
                stranded += self._fragment(shared, frees)
        demand = sum(p.pod.demand for p in self.alive.values())
        result = self.result
        result.peak_gpus_in_use = max(result.peak_gpus_in_use, used_gpus)
        result.peak_shared_gpus_in_use = max(result.peak_shared_gpus_in_use, used_shared)
        result.peak_nodes_in_use = max(result.peak_nodes_in_use, len(nodes))
        result.peak_demand = max(result.peak_demand, demand)
        result.max_stranded = max(result.max_stranded, stranded)
        share = stranded / capacity if capacity else 0.0
        return float(used_gpus), float(used_shared), demand, stranded, share

    def _fragment(self, shared: bool, frees: tuple[float, ...]) -> float:
        value = self._cache.get((shared, frees))
        if value is None:
            workload = self.workloads.get(shared, ())
            value = self._cache[(shared, frees)] = node_fragmentation(frees, workload)
        return value
