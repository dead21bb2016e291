"""Why a booking waits for, or can never get, the cores or memory of a node (issue 40).

The search (``NodeTimeline.earliest`` with a demand) already places a booking only where its
devices and its cores and memory are free together; this module words the reason when the
devices would fit but the node's cores or memory do not: ``short_of`` for a booking that waits
(reason ``cpus`` or ``memory``), ``never_held`` for one no node could ever hold (the submit-time
refusal and the reason ``never``).
"""

from __future__ import annotations

from dataclasses import dataclass

from scheduler import sharing
from scheduler.placement import NO_DEMAND, fits_window
from scheduler.timeline import NodeTimeline
from scheduler.types import REASON_CPUS, REASON_MEMORY, Request


@dataclass(frozen=True)
class Short:
    """A node whose devices fit but whose cores (``field`` "cpus") or memory ("memory_mib")
    do not: ``free`` of ``capacity`` free (or, for ``never_held``, the most any node has),
    ``asks`` asked."""

    field: str
    node: str
    free: int
    capacity: int
    asks: int

    @property
    def reason(self) -> str:
        return REASON_CPUS if self.field == "cpus" else REASON_MEMORY

    def detail(self) -> str:
        """The waiting detail: "node gpu-a01 has 8 of 16 cores free, it asks 12"."""
        unit = "cores" if self.field == "cpus" else "MiB of memory"
        return (
            f"node {self.node} has {self.free} of {self.capacity} {unit} free, it asks {self.asks}"
        )

    def never_text(self) -> str:
        """The refusal: no node that could hold its GPUs has that many cores (memory)."""
        unit = "cores" if self.field == "cpus" else "MiB of memory"
        return (
            f"asks {self.asks} {unit} per node, the most a node that could hold its GPUs "
            f"has is {self.capacity}"
        )


def demand_on(node, request: Request) -> tuple[int, int]:
    """Cores and memory ``request`` would hold on ``node`` (a fraction: on its first shared
    GPU that can hold it)."""
    if not request.fractional:
        return node.demand_of(request)
    for _, _, _, compute, _ in sharing.candidates(node, node.timeline, request):
        return sharing.demand_of(node, request, compute)
    return NO_DEMAND


def free_at(nodes, timelines, request: Request, multi: bool, t: float, among=None):
    """Indices (in order, of ``among`` when given) of the nodes of known capacity whose devices
    could hold ``request`` at instant ``t`` on ``timelines``: a cheap bound of ``short_of``'s
    nodes (its devices must be free at ``start`` to be free from it on)."""
    found = []
    for index in range(len(nodes)) if among is None else among:
        node, timeline = nodes[index], timelines[index]
        if node.capacity is None or timeline.res is None:
            continue
        if request.fractional:
            found.append(index)  # its share of a device is not a bit: short_of tells
            continue
        mask = timeline.mask_at(t)
        if multi:
            if node.whole and mask == node.full:
                found.append(index)
        elif (mask & node.need(request.mig_profile, request.device_match)).bit_count() >= (
            request.gpus
        ):
            found.append(index)
    return found


def short_of(nodes, timelines, request: Request, multi: bool, start: float, end: float, among=None):
    """The ``Short`` of the first node (in order; of the indices ``among`` when given) where
    ``request``'s devices are free over [start, end) on ``timelines`` but its cores or memory
    are not; None when there is none."""
    end = max(end, start + 1e-9)
    for index in range(len(nodes)) if among is None else among:
        node, timeline = nodes[index], timelines[index]
        if node.capacity is None or timeline.res is None:
            continue
        cpus, memory = demand_on(node, request)
        if timeline.room(cpus, memory, start, end):
            continue  # cheaper than the devices: most nodes are told apart here
        if not _devices_fit(node, timeline, request, multi, start, end):
            continue
        used_cpus, used_memory = timeline.res.peak(start, end)
        capacity = node.capacity
        if used_cpus + cpus > capacity.cpus:
            return Short("cpus", node.name, int(capacity.cpus - used_cpus), capacity.cpus, cpus)
        free = int(capacity.memory_mib - used_memory)
        return Short("memory_mib", node.name, free, capacity.memory_mib, memory)
    return None


def never_held(request: Request, nodes, multi: bool) -> Short | None:
    """The ``Short`` when ``request``'s devices fit on the empty cluster but no node that could
    hold them ever has the cores (else the memory) it asks; None otherwise."""
    bare = [NodeTimeline(0.0, node.full) for node in nodes]
    if not fits_window(nodes, bare, request, multi, 0.0, 0.0, False):
        return None
    empty = [NodeTimeline(0.0, node.full, node.capacity) for node in nodes]
    if fits_window(nodes, empty, request, multi, 0.0, 0.0):
        return None
    able = [
        node
        for node, timeline in zip(nodes, bare, strict=True)
        if _devices_fit(node, timeline, request, multi, 0.0, 1e-9)
    ]
    known = [node for node in able if node.capacity is not None]
    if not known:
        return None
    demands = [demand_on(node, request) for node in known]
    if any(d[0] > node.capacity.cpus for node, d in zip(known, demands, strict=True)):
        most = max(node.capacity.cpus for node in known)
        asks = max(d[0] for d in demands)
        return Short("cpus", "", most, most, asks)
    most = max(node.capacity.memory_mib for node in known)
    return Short("memory_mib", "", most, most, max(d[1] for d in demands))


def _devices_fit(node, timeline, request: Request, multi: bool, start: float, end: float):
    """Whether ``request``'s devices on ``node`` (all of it, across nodes) are free over
    [start, end), cores and memory aside."""
    if multi:
        matches = node.whole and node.need(None, request.device_match) == node.full
        return matches and timeline.free_mask(start, end) == node.full
    if not request.fractional and (request.gpu_model is not None or request.gpus < 2):
        need = node.need(request.mig_profile, request.device_match)
        return (timeline.free_mask(start, end) & need).bit_count() >= request.gpus
    return fits_window([node], [timeline], request, False, start, end, False)
