"""Where and when a request fits: per-node timelines, best-fit packing, cooler-GPU tie-breaks.

A request that fits on one node goes on one node; a larger one takes whole nodes of whole GPUs.
A request of 2 or more GPUs that names no model gets GPUs of one model unless it says any model
will do (``keeps_one_model``, the one rule; ``searches`` applies it to every search here).
Searches for one request shape (count, MIG profile, model, duration) share a lazy heap of per-node
earliest starts: a reservation only makes starts later, so a stale entry is a lower bound that is
recomputed when it reaches the top, and most requests touch one or two nodes instead of all.
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping
from dataclasses import dataclass, replace
from functools import lru_cache
from itertools import combinations

from scheduler import sharing
from scheduler.resources import node_demand
from scheduler.timeline import NodeTimeline
from scheduler.topology import best_set, set_quality
from scheduler.types import NODE_UP, Device, NodeResources, Policy, Request

NO_DEMAND = (0, 0)  # what a booking holds of a node whose cores and memory are unknown
_DEFAULTS = Policy()


@dataclass(frozen=True)
class Fit:
    """A placement found by a search: start time and (node index, device bitmask) pairs."""

    start: float
    parts: tuple[tuple[int, int], ...]


class Node:
    """Working record of one node: its devices in bit order, its timeline and (where known)
    its cores and memory (``capacity``)."""

    def __init__(
        self,
        index: int,
        name: str,
        devices: list[Device],
        now: float,
        capacity: NodeResources | None = None,
        policy: Policy | None = None,
    ) -> None:
        self.index = index
        self.name = name
        self.devices = devices
        self.up = all(device.node_state == NODE_UP for device in devices)
        self.full = (1 << len(devices)) - 1
        # A shared GPU's bit is never free: fractions hold it in the timeline's ``shares``.
        self.shared_bits = [bit for bit, device in enumerate(devices) if device.shared]
        self.capacity = capacity
        self.policy = policy if policy is not None else _DEFAULTS
        free = self.full & ~sum(1 << bit for bit in self.shared_bits)
        self.timeline = NodeTimeline(now, free, capacity)
        self._demands: dict[tuple, tuple[int, int]] = {}
        self._whole_demands: dict[tuple, tuple[int, int]] = {}
        self.whole = all(device.profile is None for device in devices)
        self.models = frozenset(device.model for device in devices if device.profile is None)
        self._need: dict[tuple, int] = {}
        self.runtimes = frozenset(r for device in devices for r in device.runtimes)
        self.cool = self.heat(self.full)
        self.group = devices[0].group if devices else ""
        # Topology only where the node reports some: other nodes keep the plain choice.
        self.topology = any(d.links or d.numa is not None for d in devices)
        self._maps: tuple[dict[int, frozenset[int]], dict[int, int | None]] | None = None
        self._sets: dict[tuple[int, int], int] = {}
        self._quality: dict[int, tuple[int, int]] = {}

    def need(self, profile: str | None, match: str | None | tuple) -> int:
        """Bitmask of this node's devices that match a MIG profile (None: whole GPU) and a
        request's ``device_match``: a model (None: any), or (model, container runtimes, any
        models will do[, the fraction asked]). A shared GPU matches a fractional request only,
        and a fractional request only a shared GPU (``sharing``)."""
        mask = self._need.get((profile, match))
        if mask is None:
            model, runtimes = match[:2] if isinstance(match, tuple) else (match, ())
            shared = isinstance(match, tuple) and len(match) > 3
            mask = 0
            if not runtimes or self.runtimes.intersection(runtimes):
                for bit, device in enumerate(self.devices):
                    if (
                        device.profile == profile
                        and device.shared == shared
                        and (model is None or device.model == model)
                    ):
                        mask |= 1 << bit
            self._need[(profile, match)] = mask
        return mask

    def demand(self, cpus: int | None, memory_mib: int | None, equivalents: float):
        """(cores, memory MiB) a booking asking ``cpus``/``memory_mib`` holds here with
        ``equivalents`` GPU-equivalents (``resources.node_demand``); (0, 0) where this node's
        capacity is unknown."""
        if self.capacity is None:
            return NO_DEMAND
        key = (cpus, memory_mib, equivalents)
        found = self._demands.get(key)
        if found is None:
            found = node_demand(cpus, memory_mib, equivalents, self.capacity, self.policy)
            self._demands[key] = found
        return found

    def demand_of(self, request: Request) -> tuple[int, int]:
        """What ``request`` (not a fraction) holds here: its GPUs' equivalents on this node
        (all of them on one node, the node's own on whole nodes)."""
        if self.capacity is None:
            return NO_DEMAND
        if request.mig_profile is None:  # whole GPUs: the count alone says (the hot path)
            key = (request.cpus, request.memory_mib, request.gpus)
            found = self._whole_demands.get(key)
            if found is None:
                equivalents = float(min(request.gpus, self.full.bit_count()))
                found = self.demand(request.cpus, request.memory_mib, equivalents)
                self._whole_demands[key] = found
            return found
        return self.demand(request.cpus, request.memory_mib, self.equivalents(request))

    def equivalents(self, request: Request) -> float:
        """GPU-equivalents ``request`` (not a fraction) holds on this node: its count of
        whole GPUs (a whole node's own count when it takes whole nodes), or of MIG slices
        times a slice's fraction."""
        if request.mig_profile is None:
            return float(min(request.gpus, self.full.bit_count()))
        need = self.need(request.mig_profile, request.device_match)
        if not need:
            return float(request.gpus)
        return round(request.gpus * self.devices[(need & -need).bit_length() - 1].fraction, 9)

    def heat(self, mask: int) -> tuple[float, float]:
        """Summed temperature and utilization of the devices in ``mask`` (unknown counts 0)."""
        temp = util = 0.0
        for bit in _bits(mask):
            device = self.devices[bit]
            temp += device.temperature_c or 0.0
            util += device.utilization or 0.0
        return temp, util

    def choose(self, mask: int, count: int) -> int:
        """Pick ``count`` devices of ``mask``: fullest physical GPU first, then coolest, idlest;
        on a node that reports topology, 2 or more GPUs by ``topology.best_set`` (NVLink-connected
        first, then one NUMA domain), in that same order of preference."""
        if count >= 2 and self.topology:
            key = (mask, count)
            chosen = self._sets.get(key)
            if chosen is None:
                chosen = self._sets[key] = self._choose(mask, count, topology=True)
            return chosen
        return self._choose(mask, count)

    def quality(self, mask: int) -> tuple[int, int]:
        """How tightly the devices of ``mask`` are connected (``topology.set_quality``): lower is
        better; every set of a node without topology counts as one domain with no links."""
        if not self.topology or mask.bit_count() < 2:
            return (0, 1)
        quality = self._quality.get(mask)
        if quality is None:
            links, numa = self.topology_maps()
            quality = self._quality[mask] = set_quality(list(_bits(mask)), links, numa)
        return quality

    def topology_maps(self) -> tuple[dict[int, frozenset[int]], dict[int, int | None]]:
        """NVLink peers and NUMA node of each device, by bit."""
        if self._maps is None:
            bit_of = {device.id: bit for bit, device in enumerate(self.devices)}
            links = {
                bit: frozenset(bit_of[peer] for peer in device.links if peer in bit_of)
                for bit, device in enumerate(self.devices)
            }
            self._maps = links, {bit: device.numa for bit, device in enumerate(self.devices)}
        return self._maps

    def _choose(self, mask: int, count: int, topology: bool = False) -> int:
        bits = list(_bits(mask))
        if len(bits) == count:
            return mask
        siblings: dict[str, int] = {}
        for bit in bits:
            parent = self.devices[bit].parent
            siblings[parent] = siblings.get(parent, 0) + 1

        def key(bit: int) -> tuple:
            device = self.devices[bit]
            packing = siblings[device.parent] if device.parent else 0
            return (packing, device.temperature_c or 0.0, device.utilization or 0.0, bit)

        ordered = sorted(bits, key=key)
        if topology:
            ordered = list(best_set(ordered, count, *self.topology_maps()))
        chosen = 0
        for bit in ordered[:count]:
            chosen |= 1 << bit
        return chosen


def _bits(mask: int):
    while mask:
        low = mask & -mask
        yield low.bit_length() - 1
        mask ^= low


def build_nodes(
    devices: tuple[Device, ...],
    now: float,
    resources: Mapping[str, NodeResources] | None = None,
    policy: Policy | None = None,
) -> list[Node]:
    """Group the inventory into nodes, sorted by name, devices sorted by id (determinism);
    each with its cores and memory where ``resources`` names it (``State.node_resources``)."""
    # A new pass's nodes: forget the last one's (the memo must not keep old passes alive).
    _largest.cache_clear()
    _site.cache_clear()
    _pinned.cache_clear()
    by_node: dict[str, list[Device]] = {}
    for device in sorted(devices, key=lambda d: d.id):
        by_node.setdefault(device.node, []).append(device)
    resources = resources or {}
    return [
        Node(i, name, by_node[name], now, resources.get(name), policy)
        for i, name in enumerate(sorted(by_node))
    ]


def held_demands(alloc, where: Mapping) -> list[tuple[Node, tuple[int, int]]]:
    """(node, (cores, memory)) a live allocation or advance reservation holds on each known
    node it holds devices of (``where``: device id -> (node, bit)), by ``resources.node_demand``
    on the GPU-equivalents it holds there (a fraction: its share)."""
    equivalents: dict[int, list] = {}
    for device_id in alloc.device_ids:
        if device_id in where:
            node, bit = where[device_id]
            device = node.devices[bit]
            held = alloc.share if alloc.share < 1.0 else device.fraction
            entry = equivalents.setdefault(id(node), [node, 0.0])
            entry[1] += held
    return [
        (node, node.demand(alloc.cpus, alloc.memory_mib, round(eq, 9)))
        for node, eq in equivalents.values()
        if node.capacity is not None
    ]


def keeps_one_model(
    gpus: int, mig_profile: str | None, gpu_model: str | None, mixed_models: bool
) -> bool:
    """The one-model rule: whether a request's GPUs must all be of one model of the site's.

    A request of 2 or more whole GPUs (on one node or on several) that names no model gets
    GPUs of one model, unless it says any model will do (``mixed_models``). One device, a MIG
    instance or a named model are of one model already. The allocation pass, the estimate, the
    kept walk, preemption, the submit-time check and advance reservations all ask here.
    """
    return gpus >= 2 and mig_profile is None and gpu_model is None and not mixed_models


@dataclass(frozen=True)
class Site:
    """The whole-GPU models of a list of nodes (sorted) and whether some node has several."""

    models: tuple[str, ...]
    mixed: bool


def site_of(nodes: list[Node] | tuple[Node, ...]) -> Site:
    """The ``Site`` of these nodes (memoized for the pass, like ``_largest``)."""
    return _site(tuple(nodes))


@lru_cache(maxsize=64)
def _site(nodes: tuple[Node, ...]) -> Site:
    models = sorted({model for node in nodes for model in node.models})
    return Site(tuple(models), any(len(node.models) > 1 for node in nodes))


def searches(request: Request, site: Site, multi: bool) -> tuple[Request, ...]:
    """The searches that place ``request`` by ``keeps_one_model``: ``request`` itself where
    every set a search can give it is of one model (the rule does not apply, the site has one
    model, or one node is asked and no node mixes models), else ``request`` pinned to each
    model of the site in turn (the caller takes the best of their answers)."""
    if not keeps_one_model(request.gpus, request.mig_profile, request.gpu_model, False):
        return (request,)
    if request.mixed_models or len(site.models) < 2 or not (multi or site.mixed):
        return (request,)
    return _pinned(request, site.models)


@lru_cache(maxsize=4096)
def _pinned(request: Request, models: tuple[str, ...]) -> tuple[Request, ...]:
    return tuple(replace(request, gpu_model=model) for model in models)


def is_multi_node(request: Request, nodes: list[Node]) -> bool:
    """True when no single node has enough matching devices (of one model, where the request
    keeps one): the request takes whole nodes."""
    if request.mig_profile is not None or request.fractional:
        return False
    key = tuple(nodes)
    if not keeps_one_model(request.gpus, None, request.gpu_model, request.mixed_models):
        return request.gpus > _largest(key, request.device_match)
    choices = searches(request, _site(key), False)
    return request.gpus > max(_largest(key, choice.device_match) for choice in choices)


@lru_cache(maxsize=64)
def _largest(nodes: tuple[Node, ...], model: str | None) -> int:
    return max((n.need(None, model).bit_count() for n in nodes), default=0)


class Finder:
    """Earliest-fit searches over a list of nodes, with the lazy per-shape heaps."""

    def __init__(self, nodes: list[Node], now: float) -> None:
        self.nodes = nodes
        self.now = now
        self._heaps: dict[tuple, list] = {}
        self._whole: dict[float, dict] = {}
        self._need_lists: dict[tuple, list[int]] = {}
        self._whole_nodes: dict[str | None, list[Node]] = {}
        self.grouped = any(node.group for node in nodes)  # some node has a network group
        self.site = site_of(nodes)
        self.shared = sharing.SharedNodes(nodes)  # fractions search these nodes only
        self.resourced = any(node.capacity is not None for node in nodes)

    def bounds(self) -> tuple[dict, dict]:
        """A copy of the lazy lower bounds (the shape heaps and the whole-node bounds).

        Occupying only makes starts later, so they stay lower bounds for any later state of
        the same timelines: a Finder on copies of those timelines may ``resume`` from them.
        """
        heaps = {shape: list(heap) for shape, heap in self._heaps.items()}
        return heaps, {floor: dict(cache) for floor, cache in self._whole.items()}

    def resume(self, bounds: tuple[dict, dict]) -> None:
        """Start from ``bounds()`` taken on an earlier state of these nodes' timelines."""
        heaps, whole = bounds
        self._heaps = {shape: list(heap) for shape, heap in heaps.items()}
        self._whole = {floor: dict(cache) for floor, cache in whole.items()}

    def find(self, request: Request, multi: bool, not_before: float) -> Fit | None:
        """Earliest fit of ``request`` at or after ``not_before`` (None: never on these nodes).

        Requests of one shape share a heap whatever their duration: it is keyed by the duration
        rounded down to a power of two, and a start that fits a shorter duration is a lower
        bound for a longer one. Only nodes whose bound is not later than the best start found
        so far get an exact search, so a pass costs about one heap per shape and duration
        octave, not one full scan per distinct duration.
        """
        if request.fractional:
            found = sharing.find(self.shared.of(request), request, not_before)
            return None if found is None else Fit(found[0], ((found[1], 1 << found[2]),))
        choices = searches(request, self.site, multi)
        if multi:
            return self._find_whole_nodes(request, not_before, choices)
        floor = _octave(request.duration_s)
        # The heap's bounds are starts of the devices alone, shared by every demand of cores
        # and memory (they only make a start later); exact searches take the request's own.
        exact: list = []
        for choice in choices:
            shape = (choice.gpus, choice.mig_profile, choice.device_match, floor)
            heap = self._heaps.get(shape)
            if heap is None:
                heap = self._heaps[shape] = self._scan(choice, floor)
                heapq.heapify(heap)
            exact += self._find_single(heap, choice, floor, not_before)
        return self._choose_single(exact, request.gpus)

    def _needs(self, profile: str | None, model: str | None) -> list[int]:
        """Each node's mask of devices matching a profile and model, by node index."""
        key = (profile, model)
        needs = self._need_lists.get(key)
        if needs is None:
            needs = self._need_lists[key] = [node.need(profile, model) for node in self.nodes]
        return needs

    def _entry(self, node: Node, request: Request, duration: float, not_before: float):
        need = node.need(request.mig_profile, request.device_match)
        found = node.timeline.earliest(need, request.gpus, duration, not_before)
        if found is None:
            return None
        start, mask = found
        return (start, mask.bit_count() - request.gpus, node.index, node.timeline.version, mask)

    def _scan(self, request: Request, duration: float) -> list:
        entries = []
        for node in self.nodes:
            if node.need(request.mig_profile, request.device_match).bit_count() >= request.gpus:
                entry = self._entry(node, request, duration, self.now)
                if entry is not None:
                    entries.append(entry)
        return entries

    def _find_single(self, heap: list, request: Request, floor: float, not_before: float) -> list:
        """Pop nodes in order of their lower bound until none can beat the best exact start;
        the exact entries found (for ``_choose_single``). The bounds are the devices' alone;
        exact starts take the request's cores and memory too."""
        exact, kept, best = [], [], None
        nodes, count, duration = self.nodes, request.gpus, request.duration_s
        needs = self._needs(request.mig_profile, request.device_match)
        resourced = self.resourced
        while heap:
            bound = heap[0][0]  # max(bound, not_before) <= best, without the call (hot loop)
            if best is not None and (bound if bound > not_before else not_before) > best:
                break
            entry = heapq.heappop(heap)
            node = nodes[entry[2]]
            timeline = node.timeline
            need = needs[entry[2]]
            if entry[3] != timeline.version:
                # Occupying only makes starts later: resume the bound from the stale one.
                found = timeline.earliest(need, count, floor, entry[0])
                if found is not None:
                    again = (found[0], found[1].bit_count() - count, entry[2], timeline.version)
                    heapq.heappush(heap, again + (found[1],))
                continue
            kept.append(entry)
            begin = entry[0] if entry[0] > not_before else not_before
            demand = node.demand_of(request) if resourced else NO_DEMAND
            found = timeline.earliest(need, count, duration, begin, demand)
            if found is not None:
                start, mask = found
                exact.append((start, mask.bit_count() - count, entry[2], timeline.version, mask))
                if best is None or start < best:
                    best = start
        for entry in kept:
            heapq.heappush(heap, entry)
        return exact

    def _choose_single(self, entries: list, count: int) -> Fit | None:
        """Earliest start; then best fit (fewest spare devices); then the best-connected set
        (``Node.quality``); then coolest, idlest node."""
        if not entries:
            return None
        start, waste = min(entry[:2] for entry in entries)
        tied = [entry for entry in entries if entry[0] == start and entry[1] == waste]
        if len(tied) == 1:
            node = self.nodes[tied[0][2]]
            return Fit(start, ((node.index, node.choose(tied[0][4], count)),))
        best = None
        for entry in tied:
            node = self.nodes[entry[2]]
            chosen = node.choose(entry[4], count)
            key = (entry[1], node.quality(chosen), node.heat(chosen), node.index)
            if best is None or key < best[0]:
                best = (key, node.index, chosen)
        return Fit(start, ((best[1], best[2]),))

    def better(self, request: Request, fit: Fit, deadline: float) -> Fit | None:
        """The earliest fit of a one-node ``request`` starting by ``deadline`` on a set better
        connected (``Node.quality``) than ``fit``'s, the best-connected at that start; None
        when there is none. Starts are ``fit.start`` or a timeline breakpoint: a set becomes
        free only there."""
        (index, mask), count = fit.parts[0], request.gpus
        worst = self.nodes[index].quality(mask)
        best = None
        matches = [choice.device_match for choice in searches(request, self.site, False)]
        for node, match in ((node, match) for match in matches for node in self.nodes):
            need = node.need(None, match)
            if not node.topology or need.bit_count() < count:
                continue
            if node.quality(node.choose(need, count)) >= worst:
                continue  # even all free, this node has no better set
            timeline, demand = node.timeline, node.demand_of(request)
            times = sorted(set(timeline.times) | set(timeline.res.times if timeline.res else ()))
            starts = [fit.start] + [t for t in times if fit.start < t <= deadline]
            for start in starts:
                end = start + request.duration_s
                free = timeline.free_mask(start, end) & need
                if free.bit_count() < count or not timeline.room(*demand, start, end):
                    continue
                chosen = node.choose(free, count)
                quality = node.quality(chosen)
                if quality < worst:
                    key = (start, quality, node.heat(chosen), node.index)
                    if best is None or key < best[0]:
                        best = (key, node.index, chosen)
                    break
        return None if best is None else Fit(best[0][0], ((best[1], best[2]),))

    def whole_nodes(self, model: str | None) -> list[Node]:
        """Nodes of whole GPUs (of ``model``) that a multi-node request may take."""
        nodes = self._whole_nodes.get(model)
        if nodes is None:
            nodes = [n for n in self.nodes if n.whole and n.need(None, model) == n.full]
            self._whole_nodes[model] = nodes
        return nodes

    def _find_whole_nodes(
        self, request: Request, not_before: float, choices: tuple[Request, ...]
    ) -> Fit | None:
        """Earliest start with enough whole nodes free together, the coolest among equals;
        all of one of ``choices``' matches (``searches``: one per model, or the request's own).

        At a candidate start t every node's own earliest start from t is needed only up to the
        nodes that make up the count: nodes come off a heap keyed by a lower bound (the start
        for the duration's octave, shared across requests) and get an exact search only when
        they reach the top. When the nodes found start later than t, t moves there and the
        exact starts found so far become the new lower bounds. One heap serves every choice
        (their nodes are apart: one model each): the first choice to make up the count wins.
        """
        groups = [self.whole_nodes(choice.device_match) for choice in choices]
        if self.resourced:  # only nodes that can ever hold the cores and memory asked
            groups = [[n for n in g if _can_hold(n, n.demand_of(request))] for g in groups]
        groups = [g for g in groups if sum(n.full.bit_count() for n in g) >= request.gpus]
        if not groups:
            return None
        member = {node.index: k for k, group in enumerate(groups) for node in group}
        eligible = [node for group in groups for node in group]
        floor = _octave(request.duration_s)
        cache = self._whole.setdefault(floor, {})
        bounds = {node.index: self._whole_bound(node, cache, floor) for node in eligible}
        t, duration = not_before, request.duration_s
        while True:
            heap = [(max(bounds[n.index], t), n.cool, n.index, False) for n in eligible]
            heapq.heapify(heap)
            chosen, totals = [[] for _ in groups], [0] * len(groups)
            while True:
                start, cool, index, exact = heapq.heappop(heap)
                if exact:
                    k = member[index]
                    chosen[k].append(index)
                    totals[k] += self.nodes[index].full.bit_count()
                    if totals[k] >= request.gpus:
                        break
                    continue
                node = self.nodes[index]
                count, demand = node.full.bit_count(), node.demand_of(request)
                found = node.timeline.earliest(node.full, count, duration, start, demand)
                if found is None:  # its cores or memory are never free that long
                    if not heap:
                        return None
                    continue
                bounds[index] = found[0]
                heapq.heappush(heap, (found[0], cool, index, True))
            if start == t:
                picked = chosen[k]
                if self.grouped:
                    picked = self._one_group(groups[k], picked, bounds, request, t)
                return Fit(t, tuple((index, self.nodes[index].full) for index in picked))
            t = start

    def _one_group(
        self, eligible: list[Node], chosen: list[int], bounds: dict, request: Request, t: float
    ) -> list[int]:
        """Nodes of one network group free at ``t`` instead of ``chosen``, where a group can
        hold the request: fewest spare GPUs, then fewest nodes, then coolest, then its name.
        Only nodes free at ``t`` are considered, so the start never moves."""
        groups = {self.nodes[index].group for index in chosen}
        if len(groups) == 1 and "" not in groups:
            return chosen
        end = t + request.duration_s
        by_group: dict[str, list[Node]] = {}
        for node in sorted(eligible, key=lambda n: (n.cool, n.index)):
            if (
                node.group
                and bounds[node.index] <= t
                and node.timeline.free_mask(t, end) == node.full
                and node.timeline.room(*node.demand_of(request), t, end)
            ):
                by_group.setdefault(node.group, []).append(node)
        best = None
        for group, nodes in by_group.items():
            picked, total = [], 0
            for node in nodes:
                if total >= request.gpus:
                    break
                picked.append(node)
                total += node.full.bit_count()
            if total >= request.gpus:
                cool = tuple(map(sum, zip(*(node.cool for node in picked), strict=True)))
                key = (total, len(picked), cool, group)
                if best is None or key < best[0]:
                    best = (key, [node.index for node in picked])
        return chosen if best is None else best[1]

    @staticmethod
    def _whole_bound(node: Node, cache: dict, floor: float) -> float:
        """Earliest start of the whole node for ``floor`` seconds from now, cached by version.

        Occupying only makes starts later, so a stale value is a lower bound to resume from.
        """
        known = cache.get(node.index)
        if known is not None and known[0] == node.timeline.version:
            return known[1]
        start = node.timeline.times[0] if known is None else known[1]
        found = node.timeline.earliest(node.full, node.full.bit_count(), floor, start)
        cache[node.index] = (node.timeline.version, found[0])
        return found[0]


def _can_hold(node: Node, demand: tuple[int, int]) -> bool:
    """Whether ``node``'s capacity could ever hold ``demand`` (cores, memory)."""
    capacity = node.capacity
    return capacity is None or (demand[0] <= capacity.cpus and demand[1] <= capacity.memory_mib)


def _octave(duration: float) -> float:
    """``duration`` rounded down to a power of two seconds (at least 1)."""
    if duration < 2:
        return min(duration, 1.0)
    return float(1 << (int(duration).bit_length() - 1))


def fits_window(
    nodes: list[Node],
    timelines,
    request: Request,
    multi: bool,
    start: float,
    end: float,
    resources: bool = True,
):
    """Whether ``request`` fits on ``nodes`` over [start, end] with these timelines: its
    devices and (``resources``) its cores and memory on each node."""
    if request.fractional:
        return sharing.fits_window(nodes, timelines, request, start, end, resources)
    end = max(end, start + 1e-9)
    choices = searches(request, site_of(nodes), multi)
    if len(choices) > 1:
        return any(fits_window(nodes, timelines, c, multi, start, end, resources) for c in choices)
    if multi:
        total = 0
        for node, timeline in zip(nodes, timelines, strict=True):
            if node.whole and node.need(None, request.device_match) == node.full:
                if timeline.free_mask(start, end) == node.full and (
                    not resources or timeline.room(*node.demand_of(request), start, end)
                ):
                    total += node.full.bit_count()
        return total >= request.gpus
    for node, timeline in zip(nodes, timelines, strict=True):
        need = node.need(request.mig_profile, request.device_match)
        if (timeline.free_mask(start, end) & need).bit_count() >= request.gpus and (
            not resources or timeline.room(*node.demand_of(request), start, end)
        ):
            return True
    return False


def fit_horizon(
    nodes: list[Node], timelines, request: Request, multi: bool, start: float, resources=True
):
    """The latest end such that ``request`` fits on ``nodes`` over [start, end), or None when
    it does not fit even at that instant (``resources`` False: its devices alone, a bound of
    the horizon with its cores and memory).

    ``fits_window(..., start, end)`` holds exactly when this is not None and ``end`` is at most
    it, so one walk answers every duration of a request shape.
    """
    if request.fractional:
        return sharing.fit_horizon(nodes, timelines, request, start, resources)
    choices = searches(request, site_of(nodes), multi)
    matches = [choice.device_match for choice in choices]
    if multi:
        ends = []
        for node, timeline in zip(nodes, timelines, strict=True):
            if node.whole and any(node.need(None, match) == node.full for match in matches):
                count = node.full.bit_count()
                demand = node.demand_of(request) if resources else NO_DEMAND
                end = timeline.free_until(node.full, count, start, demand)
                if end is not None:
                    ends.append((end, node))
        ends.sort(key=lambda pair: -pair[0])
        best = None
        for match in matches:  # the latest end of any one model searched
            total = 0
            for end, node in ends:
                if node.need(None, match) == node.full:
                    total += node.full.bit_count()
                    if total >= request.gpus:
                        best = end if best is None else max(best, end)
                        break
        return best
    if len(choices) > 1:
        ends = [fit_horizon(nodes, timelines, c, multi, start, resources) for c in choices]
        return max((end for end in ends if end is not None), default=None)
    best = None
    profile, match, count = request.mig_profile, request.device_match, request.gpus
    for node, timeline in zip(nodes, timelines, strict=True):
        need = node.need(profile, match)
        if need.bit_count() >= count:
            end = timeline.free_until(need, count, start)  # the devices alone first
            if end is None or (best is not None and end <= best):
                continue
            if resources and timeline.res is not None:
                room = timeline.res.free_until(*node.demand_of(request), start)
                end = None if room is None else min(end, room)
            if end is not None and (best is None or end > best):
                best = end
    return best


def fewest_victims(victims: list[tuple[int, int, str]], missing: int) -> tuple | None:
    """Victims (level, bitmask, id) covering ``missing`` devices: lowest QOS first, then fewest.

    The highest QOS level touched is kept as low as possible, then the number of victims, then
    the sum of their levels. Exact over subsets for up to 10 candidates, greedy beyond.
    """
    for ceiling in sorted({victim[0] for victim in victims}):
        allowed = [victim for victim in victims if victim[0] <= ceiling]
        found = _fewest(allowed, missing)
        if found is not None:
            return found
    return None


def _fewest(victims: list[tuple[int, int, str]], missing: int) -> tuple | None:
    if len(victims) > 10:
        picked, freed = [], 0
        for victim in sorted(victims, key=lambda v: (v[0], -v[1].bit_count(), v[2])):
            picked.append(victim)
            freed |= victim[1]
            if freed.bit_count() >= missing:
                return tuple(picked)
        return None
    for size in range(1, len(victims) + 1):
        options = [c for c in combinations(victims, size) if _freed(c).bit_count() >= missing]
        if options:
            return min(options, key=lambda c: (sum(v[0] for v in c), [v[2] for v in c]))
    return None


def _freed(combo) -> int:
    mask = 0
    for victim in combo:
        mask |= victim[1]
    return mask
