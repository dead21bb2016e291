"""Placing an advance reservation: the devices a fixed window gets, decided at submission.

The caller reads the candidate devices and the live holds that overlap the window (under its own
locks) and asks here; the same overlap rule says whether an extension's devices stay free.

Rules: a request that fits on one node goes on one node, the fullest that still fits (best fit,
so whole nodes stay free for large requests), and there gets its GPUs by the allocation pass's
rule (``topology.best_set``: NVLink-connected first, then one NUMA domain, then the lowest ids);
a larger one takes whole free nodes, largest first, those of one network group where one group
can hold it; a MIG slice goes on the GPU with the most slices already held in the window. Ids are the
inventory's own integers and every remaining tie goes to the lowest. Like the allocation pass,
2 or more GPUs with no model asked are of one model unless any will do
(``placement.keeps_one_model``): each model is placed by these rules and the placement on the
fewest nodes, then with the fewest spare GPUs there, then of the first model, is taken.
A fraction of a shared GPU (``Wanted.gpu_fraction`` / ``gpu_memory_mib``) goes on the shared GPU
with room for it over the whole window (its compute and memory by ``sharing.share_on``) that is
fullest in the window (best fit, as the allocation pass packs them); shared GPUs take nothing else.

With ``Hosts`` (the nodes' cores and memory and what bookings hold of them over the window), a
node is a candidate only where the cores and memory the reservation would hold there
(``resources.node_demand``: what it asks per node, else the site default or the node's share for
the GPU-equivalents it takes there) fit beside the most held at once in the window; a node with
no capacity known counts GPUs alone, as in the allocation pass. When the GPUs alone would have
been placed, ``Placement.short`` names the resource that stopped it ("cpus" or "memory").
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from scheduler import sharing
from scheduler.placement import keeps_one_model
from scheduler.resources import node_demand
from scheduler.topology import best_set
from scheduler.types import NodeResources, Policy


@dataclass(frozen=True)
class Slot:
    """A bookable device on an up node: a whole GPU (``mig`` None) or a MIG instance of GPU
    ``gpu``. ``profile`` is the MIG profile (None for a whole GPU), ``fraction`` its share."""

    node: int
    gpu: int
    mig: int | None = None
    model: str = ""
    profile: str | None = None
    fraction: float = 1.0
    compute: tuple[int, int] | None = None  # a MIG instance's compute slices [first, end)
    links: tuple[int, ...] = ()  # the GPUs (``gpu`` ids) of its node it has an NVLink to
    numa: int | None = None  # its NUMA node (None: unknown)
    group: str = ""  # its node's network group (rack or switch; "": none)
    shared: bool = False  # a shared GPU: fractions only
    memory_mib: int = 0  # its memory (a shared GPU's, which fractions share)
    held_mib: int | None = None  # placed for a fraction: the memory it holds (its share: fraction)


@dataclass(frozen=True)
class Hold:
    """A live allocation of GPU ``gpu`` (of its MIG instance ``mig``) over [start, end).

    ``id`` is the caller's own id for it, so a refusal can name what is in the way.
    """

    gpu: int
    mig: int | None
    start: float
    end: float
    fraction: float = 1.0
    id: int = 0
    compute: tuple[int, int] | None = None  # the compute slices it holds [first, end), if known
    share: float = 1.0  # a fraction of a shared GPU: its compute share (1: all of the GPU)
    memory_mib: int | None = None  # and the memory it holds (None: a whole device)


@dataclass(frozen=True)
class Wanted:
    """A reservation request: ``gpus`` whole GPUs, or one MIG instance of ``mig_profile``."""

    gpus: int
    start: float
    end: float
    mig_profile: str | None = None
    gpu_model: str | None = None
    mixed_models: bool = False  # any models will do (else GPUs of one model: see above)
    gpu_fraction: float | None = None  # a fraction of one shared GPU (see above)
    gpu_memory_mib: int | None = None
    cpus: int | None = None  # cores per node (None: the default, ``node_demand``)
    memory_mib: int | None = None  # host memory per node (None: the default)

    @property
    def fractional(self) -> bool:
        """It asks for a fraction of one shared GPU."""
        return self.gpu_fraction is not None or self.gpu_memory_mib is not None


@dataclass(frozen=True)
class HostHold:
    """Cores and memory a booking holds on node ``node`` over [start, end)."""

    node: int
    start: float
    end: float
    cpus: int
    memory_mib: int


@dataclass(frozen=True)
class Hosts:
    """The nodes' cores and memory (``capacities`` by node; a node absent counts GPUs alone),
    what bookings hold of them (``holds``, those overlapping the window at least) and the
    policy whose defaults per GPU ``node_demand`` reads."""

    capacities: Mapping[int, NodeResources]
    holds: tuple[HostHold, ...] = ()
    policy: Policy = field(default_factory=Policy)

    def room(self, wanted: Wanted) -> _Room:
        return _Room(self, wanted)


class _Room:
    """Whether a node has the cores and memory for ``wanted`` over its window (peaks cached)."""

    def __init__(self, hosts: Hosts, wanted: Wanted) -> None:
        self.hosts, self.wanted = hosts, wanted
        self._free: dict[int, tuple[int, int]] = {}

    def short(self, node: int, equivalents: float) -> str | None:
        """ "cpus" or "memory" where the node lacks it for ``equivalents`` GPU-equivalents of
        ``wanted`` there, else None."""
        capacity = self.hosts.capacities.get(node)
        if capacity is None:
            return None
        cpus, memory = node_demand(
            self.wanted.cpus, self.wanted.memory_mib, equivalents, capacity, self.hosts.policy
        )
        free_cpus, free_memory = self._free_on(node, capacity)
        if cpus > free_cpus:
            return "cpus"
        if memory > free_memory:
            return "memory"
        return None

    def fits(self, node: int, equivalents: float) -> bool:
        return self.short(node, equivalents) is None

    def _free_on(self, node: int, capacity: NodeResources) -> tuple[int, int]:
        if node not in self._free:
            start, end = self.wanted.start, self.wanted.end
            held = [
                h for h in self.hosts.holds if h.node == node and h.start < end and h.end > start
            ]
            most_cpus = most_memory = 0
            # The most held at once: at the window's start or where a hold starts inside it.
            for at in {start, *(h.start for h in held if h.start > start)}:
                now = [h for h in held if h.start <= at < h.end]
                most_cpus = max(most_cpus, sum(h.cpus for h in now))
                most_memory = max(most_memory, sum(h.memory_mib for h in now))
            self._free[node] = (capacity.cpus - most_cpus, capacity.memory_mib - most_memory)
        return self._free[node]


class _AnyRoom:
    """No hosts given: every node has room (GPUs alone)."""

    def short(self, node: int, equivalents: float) -> str | None:
        return None

    def fits(self, node: int, equivalents: float) -> bool:
        return True


@dataclass(frozen=True)
class Placement:
    """The slots a reservation takes (empty: none fit) and how many matching slots were free;
    ``short``: "cpus" or "memory" where the GPUs alone would have been placed."""

    slots: tuple[Slot, ...]
    free: int
    short: str | None = None


def blocks(hold: Hold, slot: Slot) -> bool:
    """Whether ``hold`` uses ``slot``'s device: a hold on a GPU takes all of it, a hold on a
    MIG instance takes that instance (and so the GPU as a whole) and, where both compute-slice
    ranges are known, any instance of another layout on the same compute slices."""
    if slot.mig is None:
        return hold.gpu == slot.gpu
    if hold.gpu != slot.gpu:
        return False
    if hold.mig is None or hold.mig == slot.mig:
        return True
    if hold.compute is None or slot.compute is None:
        return False
    return hold.compute[0] < slot.compute[1] and slot.compute[0] < hold.compute[1]


def clashes(
    slots: tuple[Slot, ...], holds: tuple[Hold, ...], start: float, end: float
) -> tuple[Hold, ...]:
    """The holds that keep any of ``slots`` from being free over [start, end), earliest first."""
    by_gpu: dict[int, list[Slot]] = defaultdict(list)
    for slot in slots:
        by_gpu[slot.gpu].append(slot)
    found = [
        hold
        for hold in holds
        if hold.start < end
        and hold.end > start
        and any(blocks(hold, s) for s in by_gpu.get(hold.gpu, ()))
    ]
    return tuple(sorted(found, key=lambda h: (h.start, h.gpu, h.mig or 0)))


def holds_by_gpu(holds: tuple[Hold, ...], start: float, end: float) -> dict[int, list[Hold]]:
    """The holds that overlap [start, end), grouped by GPU: a slot is checked against the holds
    of its own GPU only (O(slots + holds), not O(slots x holds))."""
    grouped: dict[int, list[Hold]] = defaultdict(list)
    for hold in holds:
        if hold.start < end and hold.end > start:
            grouped[hold.gpu].append(hold)
    return grouped


def reserve(
    wanted: Wanted,
    slots: tuple[Slot, ...],
    holds: tuple[Hold, ...],
    hosts: Hosts | None = None,
) -> Placement:
    """The slots ``wanted`` gets among ``slots`` given ``holds`` (and ``hosts``' cores and
    memory), by the rules above."""
    placed = _reserve(wanted, slots, holds, _AnyRoom() if hosts is None else hosts.room(wanted))
    if placed.slots or hosts is None:
        return placed
    alone = _reserve(wanted, slots, holds, _AnyRoom())
    if not alone.slots:
        return placed
    room, equivalents = hosts.room(wanted), defaultdict(float)
    for slot in alone.slots:
        equivalents[slot.node] += slot.fraction
    shorts = [room.short(node, amount) for node, amount in sorted(equivalents.items())]
    short = next((s for s in shorts if s is not None), "cpus")
    return replace(placed, short=short)


def _reserve(wanted: Wanted, slots: tuple[Slot, ...], holds: tuple[Hold, ...], room) -> Placement:
    if wanted.fractional:
        return _one_share(wanted, slots, holds, room)
    if keeps_one_model(wanted.gpus, wanted.mig_profile, wanted.gpu_model, wanted.mixed_models):
        models = sorted({slot.model for slot in slots if slot.profile is None})
        if len(models) > 1:
            return _one_model(wanted, slots, holds, models, room)
    matching = [s for s in slots if _matches(s, wanted)]
    by_gpu = holds_by_gpu(holds, wanted.start, wanted.end)
    window = [hold for group in by_gpu.values() for hold in group]
    free = [s for s in matching if not any(blocks(h, s) for h in by_gpu.get(s.gpu, ()))]
    if wanted.mig_profile is not None:
        chosen = _one_slice([s for s in free if room.fits(s.node, s.fraction)], window)
        return Placement((chosen,) if chosen else (), len(free))
    return Placement(_whole_gpus(matching, free, wanted.gpus, room), len(free))


def _one_model(
    wanted: Wanted, slots: tuple[Slot, ...], holds: tuple[Hold, ...], models: list[str], room
) -> Placement:
    """The best placement of ``wanted`` on the GPUs of one model (see the module's rules);
    none fitting, the most free GPUs of one model."""
    by_gpu = holds_by_gpu(holds, wanted.start, wanted.end)
    best, most = None, 0
    for order, model in enumerate(models):
        pinned = replace(wanted, gpu_model=model)
        placed = _reserve(pinned, slots, holds, room)
        most = max(most, placed.free)
        if not placed.slots:
            continue
        nodes = {slot.node for slot in placed.slots}
        # Spare: this model's free GPUs on those nodes that the placement leaves free.
        left = sum(
            1
            for s in slots
            if s.node in nodes
            and _matches(s, pinned)
            and not any(blocks(h, s) for h in by_gpu.get(s.gpu, ()))
        )
        key = (len(nodes), left - len(placed.slots), order)
        if best is None or key < best[0]:
            best = (key, placed)
    return best[1] if best else Placement((), most)


def _one_share(wanted: Wanted, slots: tuple[Slot, ...], holds: tuple[Hold, ...], room) -> Placement:
    """The fullest shared GPU with room for the fraction over the whole window (then the lowest
    id), as a slot that says what it holds; and how many shared GPUs had room."""
    by_gpu = holds_by_gpu(holds, wanted.start, wanted.end)
    best, free = None, 0
    for slot in slots:
        if not slot.shared or (wanted.gpu_model and slot.model != wanted.gpu_model):
            continue
        held = sharing.share_of(wanted.gpu_fraction, wanted.gpu_memory_mib, slot.memory_mib)
        if held is None or not room.fits(slot.node, held[0]):
            continue
        used = sharing.ShareTimeline(wanted.start, slot.memory_mib)
        for hold in by_gpu.get(slot.gpu, ()):
            taken = sharing.held_of(hold.share, hold.memory_mib, slot.memory_mib)
            used.add(*taken, hold.start, hold.end)
        if not used.fits(*held, wanted.start, wanted.end):
            continue
        free += 1
        peak = used.peak(wanted.start, wanted.end)
        key = (-peak[0], -peak[1], slot.node, slot.gpu)
        if best is None or key < best[0]:
            best = (key, replace(slot, fraction=held[0], held_mib=held[1]))
    return Placement((best[1],) if best else (), free)


def _matches(slot: Slot, wanted: Wanted) -> bool:
    if slot.shared:
        return False  # fractions only
    if slot.profile != wanted.mig_profile:
        return False
    return not wanted.gpu_model or slot.model == wanted.gpu_model


def _whole_gpus(matching: list[Slot], free: list[Slot], gpus: int, room) -> tuple[Slot, ...]:
    """Best-fit node when ``gpus`` fit on one, else whole free nodes, largest first; only
    nodes with ``room`` for the GPUs they would give."""
    sizes: dict[int, int] = defaultdict(int)
    for slot in matching:
        sizes[slot.node] += 1
    by_node: dict[int, list[Slot]] = defaultdict(list)
    for slot in sorted(free, key=lambda s: (s.node, s.gpu)):
        by_node[slot.node].append(slot)
    fitting = [
        (len(devs), node)
        for node, devs in by_node.items()
        if len(devs) >= gpus and room.fits(node, gpus)
    ]
    if fitting:
        _, node = min(fitting)
        return _tightest(by_node[node], gpus)
    whole = [
        devs
        for node, devs in by_node.items()
        if len(devs) == sizes[node] and room.fits(node, min(len(devs), gpus))
    ]
    whole.sort(key=lambda devs: (-len(devs), devs[0].node))
    whole = _one_group(whole, gpus)
    chosen: list[Slot] = []
    for devs in whole:
        if len(chosen) >= gpus:
            break
        chosen += devs[: gpus - len(chosen)]
    return tuple(chosen) if len(chosen) == gpus else ()


def _one_group(whole: list[list[Slot]], gpus: int) -> list[list[Slot]]:
    """The whole free nodes of one network group, where one group can hold ``gpus``: the group
    that needs the fewest nodes, then its name; else all of ``whole`` (same order)."""
    groups: dict[str, list[list[Slot]]] = defaultdict(list)
    for devs in whole:
        if devs[0].group:
            groups[devs[0].group].append(devs)
    best = None
    for group, nodes in groups.items():
        taken, total = 0, 0
        while taken < len(nodes) and total < gpus:
            total += len(nodes[taken])
            taken += 1
        if total >= gpus and (best is None or (taken, group) < best[0]):
            best = ((taken, group), nodes)
    return whole if best is None else best[1]


def _tightest(free: list[Slot], gpus: int) -> tuple[Slot, ...]:
    """``gpus`` of one node's free GPUs (lowest id first) by ``topology.best_set``."""
    if gpus < 2 or not any(s.links or s.numa is not None for s in free):
        return tuple(free[:gpus])
    by_gpu = {slot.gpu: slot for slot in free}
    links = {slot.gpu: slot.links for slot in free}
    numa = {slot.gpu: slot.numa for slot in free}
    return tuple(by_gpu[gpu] for gpu in best_set(list(by_gpu), gpus, links, numa))


def _one_slice(free: list[Slot], window: list[Hold]) -> Slot | None:
    """The free instance on the GPU with the most MIG slices held in the window (packing)."""
    if not free:
        return None
    held: dict[int, float] = defaultdict(float)
    for hold in window:
        if hold.mig is not None:
            held[hold.gpu] += hold.fraction
    return min(free, key=lambda s: (-held[s.gpu], s.node, s.gpu, s.mig))


# Starts a search for the next window tries at most (each one placement over the holds).
NEXT_WINDOW_TRIES = 500


def next_window(
    wanted: Wanted,
    slots: tuple[Slot, ...],
    holds: tuple[Hold, ...],
    *,
    until: float,
    hosts: Hosts | None = None,
) -> float | None:
    """The earliest start at or after ``wanted.start`` (at most ``until``) at which a window of
    the same length gets its slots by ``reserve``, or None.

    Devices (and cores and memory) only free up where a hold ends, so the earliest window that
    fits starts at the requested start or at the end of a hold: those are tried in order, at
    most NEXT_WINDOW_TRIES of them. ``holds`` (and ``hosts.holds``) must hold every live
    allocation overlapping [wanted.start, until + the window's length).
    """
    length = wanted.end - wanted.start
    ends = {hold.end for hold in holds if wanted.start < hold.end <= until}
    if hosts is not None:
        ends |= {hold.end for hold in hosts.holds if wanted.start < hold.end <= until}
    for start in sorted({wanted.start} | ends)[:NEXT_WINDOW_TRIES]:
        moved = replace(wanted, start=start, end=start + length)
        if reserve(moved, slots, holds, hosts).slots:
            return start
    return None
