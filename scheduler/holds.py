"""Project reservations: capacity set aside for one project, one-off or weekly.

A reservation's rule (``HoldRule``: N GPUs, optionally of a model, or every GPU of named nodes;
a window, weekly or not) is expanded by ``expand`` into concrete ``ProjectHold`` windows within a
bounded horizon, each with the devices it sets aside. In the allocation pass (``HoldViews``):

- outsiders never get a hold's devices over its window: a booking of another project on them
  must end by the window's start (a running one is never stopped);
- a member's booking (no array, on one node) that fits on its project's held devices inside the window is
  planned there first, unless general capacity would start it earlier, and is not counted
  against user or project concurrency limits (GPU-hour budgets still apply);
- with ``idle_release_s``, the devices no member booking uses once that long after the window
  opened are released to everyone for the rest of the window.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass

from scheduler.placement import Finder, Fit, Node
from scheduler.timeline import NodeTimeline
from scheduler.types import Allocation, Device, ProjectHold, Request

WEEK_S = 7 * 86400.0
# How far ahead the pass plans holds, and the most windows one reservation expands to in it.
HORIZON_S = 28 * 86400.0
MAX_OCCURRENCES = 6


@dataclass(frozen=True)
class HoldRule:
    """A project reservation as the scheduler reads it.

    ``gpus`` whole GPUs (of ``gpu_model`` if set, on ``nodes`` if named), or with ``gpus`` None
    every whole GPU of ``nodes``; over [start, end), repeated every week with ``weekly``.
    """

    rule_id: str
    project: str
    start: float
    end: float
    gpus: int | None = None
    gpu_model: str | None = None
    nodes: tuple[str, ...] = ()
    weekly: bool = False
    idle_release_s: float | None = None


def occurrences(
    rule: HoldRule, since: float, until: float, limit: int = MAX_OCCURRENCES
) -> list[tuple[float, float]]:
    """The rule's windows [start, end) that end after ``since`` and start before ``until``,
    at most ``limit`` of them, earliest first. A weekly rule longer than a week has none (it
    would overlap itself: the portal refuses it)."""
    length = rule.end - rule.start
    if length <= 0 or (rule.weekly and length > WEEK_S):
        return []
    if not rule.weekly:
        return [(rule.start, rule.end)] if rule.end > since and rule.start < until else []
    week = 0 if since < rule.end else math.floor((since - rule.end) / WEEK_S) + 1
    out: list[tuple[float, float]] = []
    while len(out) < limit:
        start = rule.start + week * WEEK_S
        if start >= until:
            break
        out.append((start, start + length))
        week += 1
    return out


def candidates(rule: HoldRule, devices: tuple[Device, ...]) -> list[Device]:
    """The whole GPUs a rule may set aside: of its model, on its nodes (where named)."""
    return [
        d
        for d in devices
        if d.profile is None
        and (not rule.gpu_model or d.model == rule.gpu_model)
        and (not rule.nodes or d.node in rule.nodes)
    ]


def choose_devices(
    rule: HoldRule,
    devices: tuple[Device, ...],
    allocations: tuple[Allocation, ...],
    start: float,
    end: float,
) -> tuple[str, ...]:
    """The devices one window of ``rule`` sets aside: every candidate without ``gpus``, else
    ``gpus`` of them, those no outsider holds in the window first, then packed on the nodes with
    the most such devices, then by node name and id (the same answer every pass)."""
    found = candidates(rule, devices)
    if rule.gpus is None:
        return tuple(sorted(d.id for d in found))
    busy = {
        d
        for a in allocations
        if a.project != rule.project and a.start < end and a.end > start
        for d in a.device_ids
    }
    free_on: dict[str, int] = {}
    for device in found:
        free_on[device.node] = free_on.get(device.node, 0) + (device.id not in busy)
    found.sort(key=lambda d: (d.id in busy, -free_on[d.node], d.node, d.id))
    return tuple(sorted(d.id for d in found[: rule.gpus]))


def claimed(project: str, device_ids, allocations, start: float, end: float) -> set[str]:
    """The devices of ``device_ids`` that a booking of ``project`` holds within [start, end)."""
    wanted = set(device_ids)
    return {
        d
        for a in allocations
        if a.project == project and a.start < end and a.end > start
        for d in a.device_ids
        if d in wanted
    }


def expand(
    rules: tuple[HoldRule, ...],
    devices: tuple[Device, ...],
    allocations: tuple[Allocation, ...],
    now: float,
    horizon_s: float = HORIZON_S,
) -> tuple[ProjectHold, ...]:
    """The concrete holds of ``rules`` from ``now`` to ``now + horizon_s`` (each rule at most
    ``MAX_OCCURRENCES`` windows). A window open at least its rule's ``idle_release_s`` keeps only
    the devices a member booking holds in it (none: the window is dropped)."""
    out = []
    for rule in rules:
        for start, end in occurrences(rule, now, now + horizon_s):
            ids = choose_devices(rule, devices, allocations, start, end)
            if rule.idle_release_s is not None and now >= start + rule.idle_release_s:
                kept = claimed(rule.project, ids, allocations, start, end)
                ids = tuple(d for d in ids if d in kept)
            if ids:
                out.append(
                    ProjectHold(f"{rule.rule_id}@{start:.0f}", rule.project, start, end, ids)
                )
    return tuple(out)


def _copy(timeline: NodeTimeline) -> NodeTimeline:
    twin = NodeTimeline(timeline.times[0], 0)
    twin.times, twin.masks = list(timeline.times), list(timeline.masks)
    twin.res = None if timeline.res is None else timeline.res.copy()  # cores, memory
    return twin


def _mask_at(timeline: NodeTimeline, t: float) -> int:
    return timeline.free_mask(t, t)


def _intersect(a: NodeTimeline, b: NodeTimeline) -> NodeTimeline:
    """Devices free in both timelines (same start)."""
    times = sorted(set(a.times) | set(b.times))
    out = NodeTimeline(times[0], 0)
    out.times = times
    out.masks = [_mask_at(a, t) & _mask_at(b, t) for t in times]
    out.res = None if a.res is None else a.res.copy()  # the cores and memory in use: ``a``'s
    return out


def _view(nodes: list[Node], timelines: list[NodeTimeline], held=None) -> list[Node]:
    """Shallow copies of ``nodes`` (same devices, caches and indices) on other timelines; with
    ``held`` (bits by node index), nodes that match only those devices (searches skip the rest)."""
    out = []
    for node, timeline in zip(nodes, timelines, strict=True):
        twin = copy.copy(node)
        twin.timeline = timeline
        if held is not None:
            twin.__class__ = _HeldNode
            twin._need = {}
            twin.held = held.get(node.index, 0)
        out.append(twin)
    return out


class _HeldNode(Node):
    """A node of a project's holds-alone view: only its held devices match any request."""

    held = 0

    def need(self, profile: str | None, match) -> int:
        return super().need(profile, match) & self.held


@dataclass(frozen=True)
class _Window:
    project: str
    node: int  # index among the pass's up nodes
    bits: int
    start: float
    end: float


class HoldViews:
    """The holds of one allocation pass: the pass's own timelines keep every hold's devices
    busy over its window (what outsiders see); each project with holds gets two more sets of
    timelines, its members' view (its own holds free) and its holds alone (only the held
    devices, only inside the windows), each with its own ``Finder``."""

    def __init__(self, holds: tuple[ProjectHold, ...], where: dict, now: float) -> None:
        self.now = now
        self.holds = holds
        self.windows: list[_Window] = []
        for hold in holds:
            if hold.end <= now:
                continue
            bits: dict[int, int] = {}
            for device_id in hold.device_ids:
                node, bit = where.get(device_id, (None, 0))
                if node is not None and node.up:
                    bits[node.index] = bits.get(node.index, 0) | 1 << bit
            start = max(hold.start, now)
            self.windows += [_Window(hold.project, i, b, start, hold.end) for i, b in bits.items()]
        self.projects = sorted({w.project for w in self.windows})
        self.longest: dict[str, float] = {}
        for w in self.windows:
            self.longest[w.project] = max(self.longest.get(w.project, 0.0), w.end - w.start)
        self._views: dict[str, tuple[list[Node], Finder, list[Node], Finder]] = {}
        self.unheld: list[NodeTimeline] = []

    def __bool__(self) -> bool:
        return bool(self.windows)

    def setup(self, nodes: list[Node]) -> None:
        """Once the live allocations are on ``nodes``' timelines: build the views, then block
        every window on ``nodes`` themselves."""
        base = [_copy(node.timeline) for node in nodes]
        self.unheld = [_copy(t) for t in base]
        for project in self.projects:
            mine = [_copy(t) for t in base]
            allowed = [NodeTimeline(self.now, 0) for _ in nodes]
            for w in self.windows:
                if w.project == project:
                    allowed[w.node].release(w.bits, w.start, w.end)
                else:
                    mine[w.node].occupy(w.bits, w.start, w.end)
            only = [_intersect(m, a) for m, a in zip(mine, allowed, strict=True)]
            held: dict[int, int] = {}
            for w in self.windows:
                if w.project == project:
                    held[w.node] = held.get(w.node, 0) | w.bits
            view, alone = _view(nodes, mine), _view(nodes, only, held)
            self._views[project] = (view, Finder(view, self.now), alone, Finder(alone, self.now))
        for node in nodes:
            self.reblock(node)

    def reblock(self, node: Node) -> None:
        """Mark every hold's devices on ``node`` busy again on its own timeline (after a
        preemption freed a victim's devices there)."""
        for w in self.windows:
            if w.node == node.index:
                node.timeline.occupy(w.bits, w.start, w.end)

    def finder_for(self, project: str) -> Finder | None:
        """The finder of ``project``'s members' view (None: it has no holds)."""
        views = self._views.get(project)
        return views[1] if views else None

    def draw(self, request: Request, multi: bool, not_before: float) -> Fit | None:
        """The earliest fit of a member's ``request`` on its project's holds alone, or None.
        Not for a request across nodes: held devices are never a whole node for ever, which
        the whole-node search assumes (it is planned in its members' view instead)."""
        views = self._views.get(request.project)
        if views is None or request.array or multi:
            return None
        if request.duration_s > self.longest.get(request.project, 0.0):
            return None  # no window of its project is that long
        return views[3].find(request, multi, not_before)

    def occupy(self, parts, start: float, end: float, demands=None) -> None:
        """A booking was placed: its devices (and ``demands``: its cores and memory on each
        part's node) are busy in every view too."""
        demands = demands or [(0, 0)] * len(parts)
        for view, _, alone, _ in self._views.values():
            for (index, mask), demand in zip(parts, demands, strict=True):
                for timeline in (view[index].timeline, alone[index].timeline):
                    timeline.occupy(mask, start, end)
                    timeline.hold(*demand, start, end)

    def reserved_bits(self, index: int, project: str, start: float, end: float) -> int:
        """Devices of node ``index`` that other projects' holds set aside within [start, end)."""
        bits = 0
        for w in self.windows:
            if w.node == index and w.project != project and w.start < end and w.end > start:
                bits |= w.bits
        return bits

    def exempt(self, project: str, parts, start: float, end: float) -> bool:
        """Whether a booking of ``project`` on ``parts`` over [start, end) lies wholly on its
        project's holds, inside one window each: it draws on them (not counted)."""
        if project not in self.projects:
            return False
        for index, mask in parts:
            covered = 0
            for w in self.windows:
                if w.project == project and w.node == index and w.start <= start and end <= w.end:
                    covered |= w.bits
            if mask & ~covered:
                return False
        return True


__all__ = [
    "HORIZON_S",
    "MAX_OCCURRENCES",
    "WEEK_S",
    "HoldRule",
    "HoldViews",
    "candidates",
    "choose_devices",
    "claimed",
    "expand",
    "occurrences",
]
