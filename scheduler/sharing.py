"""Shared GPUs: fractions of one GPU packed onto GPUs in sharing mode.

A shared GPU (``Device.shared``) is offered only to fractional requests (``Request.fractional``)
and those only go to shared GPUs, so whole GPUs, MIG slices and fractions never mix on one GPU.
What a fraction holds on a GPU (``share_on``): its compute share ``gpu_fraction`` and the memory
``gpu_memory_mib``; given one, the other is the same share of that GPU's memory (a compute share
f holds f x the GPU's memory, rounded down to a MiB; a memory request m holds the compute share
m / the GPU's memory), so a memory request fits a GPU whose share covers it. A GPU never holds
more than 1.0 of compute or more than its memory in all (``ShareTimeline``).

Placement is best fit: the earliest start, then the GPU with the least compute (then memory)
left once the fraction is on it, so fractions fill GPUs already in use and others stay free.
"""

from __future__ import annotations

from collections.abc import Mapping

from scheduler.consumables import Consumables
from scheduler.types import Device, Request

INF = float("inf")
EPS = 1e-9  # shares add up in floating point: 0.25 * 4 must fit in 1.0


def share_on(request: Request, device: Device) -> tuple[float, int] | None:
    """(compute share, memory MiB) ``request`` holds on shared ``device``, or None when it can
    never fit there (more memory than the GPU has, or memory asked of a GPU of unknown size)."""
    return share_of(request.gpu_fraction, request.gpu_memory_mib, device.memory_mib)


def share_of(fraction: float | None, memory: int | None, size: int) -> tuple[float, int] | None:
    """``share_on`` for a compute share and memory asked of a GPU of ``size`` MiB."""
    if fraction is None:
        if memory is None or size <= 0 or memory > size:
            return None
        return memory / size, memory
    if memory is None:
        return fraction, int(fraction * size)
    return (fraction, memory) if memory <= size else None


def memory_key(model: str | None) -> tuple[str, str | None]:
    """The key of ``profile_fractions`` that holds the largest memory of the site's shared GPUs
    (of ``model``; None: of any model)."""
    return ("shared-memory", model)


def shared_memories(devices) -> dict:
    """The largest memory of the shared GPUs, by model and overall (``memory_key``)."""
    largest: dict = {}
    for device in devices:
        if device.shared:
            for key in (memory_key(device.model), memory_key(None)):
                largest[key] = max(largest.get(key, 0), device.memory_mib)
    return largest


def request_share(request: Request, fractions: Mapping) -> float:
    """GPU-equivalents a fractional request counts for before it is placed (priority, quotas):
    its compute share, or for a memory request the least share it can hold (its memory over
    the largest shared GPU of its model's); once placed, the share it holds there counts."""
    if request.gpu_fraction is not None:
        return request.gpu_fraction
    largest = fractions.get(memory_key(request.gpu_model), 0)
    if not largest or request.gpu_memory_mib is None:
        return 1.0
    return min(1.0, request.gpu_memory_mib / largest)


class ShareTimeline(Consumables):
    """Compute and memory in use on one shared GPU, a step function from ``now`` on: at most
    1.0 of compute and its ``size`` MiB of memory (``Consumables``)."""

    __slots__ = ("size",)

    def __init__(self, now: float, size: int) -> None:
        super().__init__(now, 1.0 + EPS, size)
        self.size = size

    def copy(self) -> ShareTimeline:
        """An independent copy."""
        twin = ShareTimeline(self.times[0], self.size)
        twin.times, twin.compute, twin.memory = (
            list(self.times),
            list(self.compute),
            list(self.memory),
        )
        return twin

    def open_at(self, t: float) -> bool:
        """Some fraction could still go on at instant ``t``: compute is left and, on a GPU of
        known memory, memory too. A GPU of unknown memory (size 0) takes compute shares only
        (each holds 0 MiB of it; a memory request never fits it), so only compute counts."""
        i = self._index(t)
        if self.compute[i] >= 1.0 - EPS:
            return False
        return self.size <= 0 or self.memory[i] < self.size

    def left_at(self, t: float) -> tuple[float, int]:
        """(compute, memory) still free at instant ``t``."""
        i = self._index(t)
        return 1.0 - self.compute[i], self.size - self.memory[i]


def share_timeline(timeline, bit: int, device: Device) -> ShareTimeline:
    """The share timeline of device ``bit`` on a node timeline (a fresh, empty one if none)."""
    found = timeline.shares.get(bit)
    return found if found is not None else ShareTimeline(timeline.times[0], device.memory_mib)


def hold_all(timeline, bit: int, device: Device, start: float, end: float) -> None:
    """Hold all of shared device ``bit`` over [start, end) on a node timeline (a maintenance
    window: no fraction fits beside it, whatever else the GPU holds)."""
    compute, memory = held_on(device, 1.0, 0)
    timeline.hold_share(bit, share_timeline(timeline, bit, device), compute, memory, start, end)


def room_at(timeline, bit: int, device: Device, request: Request, t: float) -> bool:
    """Whether shared device ``bit`` has room for ``request``'s share at instant ``t``."""
    held = share_on(request, device)
    if held is None:
        return False
    return share_timeline(timeline, bit, device).fits(held[0], held[1], t, t)


def candidates(node, timeline, request: Request):
    """(bit, device, share timeline, compute, memory) of each shared GPU of ``node`` that
    matches ``request`` (model, container runtimes) and can ever hold it."""
    need = node.need(None, request.device_match)
    for bit, device in enumerate(node.devices):
        if need >> bit & 1:
            held = share_on(request, device)
            if held is not None:
                yield bit, device, share_timeline(timeline, bit, device), held[0], held[1]


class SharedNodes:
    """The nodes of a pass that have shared GPUs, listed once, and by what a fractional request
    matches (its model and container runtimes, as ``Node.need``): a search for a fraction walks
    those, not every node of the site."""

    def __init__(self, nodes) -> None:
        self.nodes = [node for node in nodes if node.shared_bits]
        self._by_match: dict[tuple, list] = {}

    def of(self, request: Request) -> list:
        """The nodes with a shared GPU of ``request``'s model and container runtimes."""
        key = (request.gpu_model, request.runtimes)
        found = self._by_match.get(key)
        if found is None:
            need = request.device_match
            found = self._by_match[key] = [node for node in self.nodes if node.need(None, need)]
        return found


def find(nodes, request: Request, not_before: float):
    """Earliest best fit of a fractional request on shared GPUs: (start, node index, bit), or
    None when no shared GPU of these nodes can hold it. Ties: least compute, then memory, left
    at the start once it is on (best fit), then the coolest GPU, then node and bit order."""
    best = None
    for node in nodes:
        for bit, device, shares, compute, memory in candidates(node, node.timeline, request):
            latest = INF if best is None else best[0]  # a later start cannot win
            start = _earliest(node, shares, request, compute, memory, not_before, latest)
            if start is None:
                continue
            left = shares.left_at(start)
            heat = (device.temperature_c or 0.0, device.utilization or 0.0)
            key = (start, left[0] - compute, left[1] - memory, heat, node.index, bit)
            if best is None or key < best:
                best = key
    return None if best is None else (best[0], best[4], best[5])


def _earliest(node, shares, request: Request, compute, memory, not_before, latest):
    """Earliest start with room for the share on the GPU and for its cores and memory on
    ``node`` (``NodeTimeline.earliest``'s rule for a fraction), or None."""
    duration = request.duration_s
    start = shares.earliest(compute, memory, duration, not_before, latest)
    res = node.timeline.res
    if start is None or res is None:
        return start
    cpus, host = node.demand(request.cpus, request.memory_mib, compute)
    while True:
        room = res.earliest(cpus, host, duration, start, latest)
        if room is None or room == start:
            return room
        start = shares.earliest(compute, memory, duration, room, latest)
        if start is None or start == room:
            return start


def demand_of(node, request: Request, compute: float) -> tuple[int, int]:
    """Cores and memory a fraction of ``compute`` holds on ``node`` (``Node.demand``)."""
    return node.demand(request.cpus, request.memory_mib, compute)


def fits_window(
    nodes, timelines, request: Request, start: float, end: float, resources: bool = True
) -> bool:
    """Whether a fractional request fits on some shared GPU over [start, end], with its
    cores and memory on that node (``resources``)."""
    end = max(end, start + 1e-9)
    for node, timeline in zip(nodes, timelines, strict=True):
        if not node.shared_bits:
            continue
        for _, _, shares, compute, memory in candidates(node, timeline, request):
            if shares.fits(compute, memory, start, end) and (
                not resources or timeline.room(*demand_of(node, request, compute), start, end)
            ):
                return True
    return False


def fit_horizon(
    nodes, timelines, request: Request, start: float, resources: bool = True
) -> float | None:
    """The latest end such that a fractional request fits over [start, end) (None: not even
    at ``start``), as ``placement.fit_horizon`` (``resources``: its cores and memory too)."""
    best = None
    for node, timeline in zip(nodes, timelines, strict=True):
        if not node.shared_bits:
            continue
        for _, _, shares, compute, memory in candidates(node, timeline, request):
            end = shares.free_until(compute, memory, start)
            if end is not None and resources and timeline.res is not None:
                room = timeline.res.free_until(*demand_of(node, request, compute), start)
                end = None if room is None else min(end, room)
            if end is not None and (best is None or end > best):
                best = end
    return best


def free_now(nodes) -> bool:
    """Some shared GPU of these nodes has room left at this instant (``ShareTimeline.open_at``)."""
    for node in nodes:
        for bit in node.shared_bits:
            shares = node.timeline.shares.get(bit)
            if shares is None or shares.open_at(shares.times[0]):
                return True
    return False


def held_on(device: Device, share: float, memory: int) -> tuple[float, int]:
    """(compute, memory) a live allocation holds on shared ``device``: its share and memory;
    a whole-device allocation (share 1) holds all of it."""
    return held_of(share, memory, device.memory_mib)


def held_of(share: float, memory: int | None, size: int) -> tuple[float, int]:
    """``held_on`` on a GPU of ``size`` MiB."""
    if share >= 1.0:
        return 1.0, size
    return share, memory if memory else int(share * size)


def best_victims(run, request: Request, level: int, by_node: dict):
    """(parts, victims) for a fractional request that preempts: on one shared GPU, the
    lowest-QOS, then fewest, running preemptible fractions of lower QOS whose shares make room
    for it from now to its end (as ``preemption._best_victims`` picks devices); or None."""
    now, end = run.now, run.now + request.duration_s
    qos = run.policy.qos_level
    best = None
    for index in sorted(by_node):
        node = run.nodes[index]
        for bit, device, shares, compute, memory in candidates(node, node.timeline, request):
            lower = [a for a in by_node[index] if device.id in a.device_ids and qos(a.qos) < level]
            trial, picked = shares.copy(), []
            for alloc in sorted(lower, key=lambda a: (qos(a.qos), -a.share, a.booking_id)):
                if trial.fits(compute, memory, now, end):
                    break
                held = held_on(device, alloc.share, alloc.gpu_memory_mib)
                trial.add(-held[0], -held[1], now, alloc.end)
                picked.append(alloc)
            if not picked or not trial.fits(compute, memory, now, end):
                continue
            levels = [qos(a.qos) for a in picked]
            key = (max(levels), len(picked), sum(levels), index, bit)
            if best is None or key < best[0]:
                best = (key, ((index, 1 << bit),), picked)
    return None if best is None else (best[1], best[2])


def release(node, bit: int, alloc, start: float) -> None:
    """Give back what a preempted allocation held on shared device ``bit`` from ``start``."""
    device = node.devices[bit]
    compute, memory = held_on(device, alloc.share, alloc.gpu_memory_mib)
    shares = share_timeline(node.timeline, bit, device)
    node.timeline.hold_share(bit, shares, -compute, -memory, start, alloc.end)
