"""Maintenance windows in the allocation pass: the one rule and its reason.

The rule: no booking holds a device of a window's nodes over any part of the window. A booking
that would still run when the window starts does not start there before it (its duration would
cross the window's start), and nothing starts there during it: the window's span is taken on
those nodes' timelines, like an advance reservation of the whole node that no preemption frees
(a shared GPU's fractions live in its share timeline, so there the window holds all of its
compute and memory: no fraction starts in it or runs into it, and freeing a preempted fraction's
share leaves the window's hold in place).
A node drained for a window (``NODE_MAINTENANCE``) is planned on again from the window's end
rather than counted as down, so the bookings that need it get a planned start.

A booking a window moves (its planned start is a window's end on its nodes, or it would fit
now but for a window) waits with the reason ``maintenance`` and the window named.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime

from scheduler import sharing
from scheduler.placement import Node
from scheduler.timeline import NodeTimeline
from scheduler.types import NODE_MAINTENANCE, Request, Window


class Calendar:
    """The maintenance windows of one pass that end after ``now``, by node name."""

    def __init__(self, windows: tuple[Window, ...], nodes: list[Node], now: float) -> None:
        self.now = now
        self._first: dict[tuple, Window | None] = {}
        names = {node.name for node in nodes}
        self.by_node: dict[str, list[Window]] = {}
        for window in sorted(windows, key=lambda w: (w.start, w.end, w.id)):
            if window.end <= now or window.end <= window.start:
                continue
            for name in set(window.nodes) & names:
                self.by_node.setdefault(name, []).append(window)
        for node in nodes:
            if not node.up and self._drained_for_window(node):
                node.up = True  # blocked until the window's end by ``block``

    def __bool__(self) -> bool:
        return bool(self.by_node)

    def _drained_for_window(self, node: Node) -> bool:
        states = {device.node_state for device in node.devices}
        if states != {NODE_MAINTENANCE}:
            return False
        return any(w.start <= self.now for w in self.by_node.get(node.name, ()))

    def block(self, nodes: list[Node]) -> list[NodeTimeline] | None:
        """Take every window's span on its nodes' timelines. Returns copies of ``nodes``'
        timelines as they were before (None when no window touches them)."""
        if not self:
            return None
        before = [_copy(node.timeline) for node in nodes]
        for node in nodes:
            self.reblock(node, self.now, float("inf"))
            self._hold_shared(node)
        return before

    def _hold_shared(self, node: Node) -> None:
        # Holds add up on a share timeline (unlike bits), so this is done once, not on reblock.
        for window in self.by_node.get(node.name, ()):
            begin = max(window.start, self.now)
            for bit in node.shared_bits:
                sharing.hold_all(node.timeline, bit, node.devices[bit], begin, window.end)

    def reblock(self, node: Node, start: float, end: float) -> None:
        """Take the node's windows again over [start, end) (after a preempted booking's whole
        devices were freed there; a shared GPU's window hold is never given back)."""
        for window in self.by_node.get(node.name, ()):
            begin, finish = max(window.start, start, self.now), min(window.end, end)
            if begin < finish:
                node.timeline.occupy(node.full, begin, finish)

    def clear(self, node: Node, start: float, end: float) -> bool:
        """No window of the node overlaps [start, end)."""
        return self.first_overlap(node, start, end) is None

    def first_overlap(self, node: Node, start: float, end: float) -> Window | None:
        """The earliest window of the node that overlaps [start, end), or None."""
        for window in self.by_node.get(node.name, ()):
            if window.start < end and start < window.end:
                return window
        return None

    def ending_at(
        self,
        nodes: list[Node],
        masks: list[int],
        moment: float,
        request: Request,
        bare: list[NodeTimeline],
    ) -> Window | None:
        """A window of one of ``nodes`` that ends at ``moment`` and held ``request``'s devices
        ``masks`` back: without the windows (``bare``, those nodes' timelines before
        ``block``) they are free (a shared GPU: has room for its share) just before its end,
        so what busy devices alone would allow lies inside it. None: no window moved a start
        to ``moment``."""
        for node, mask, timeline in zip(nodes, masks, bare, strict=True):
            for window in self.by_node.get(node.name, ()):
                if window.end != moment or window.start >= moment:
                    continue
                if window.start <= self.now or _free_before(node, timeline, mask, request, moment):
                    return window
        return None

    def in_the_way(self, nodes: list[Node], request: Request, end: float) -> Window | None:
        """The earliest window over [now, end) on a node with devices ``request`` could use."""
        key = (request.mig_profile, request.device_match)
        first = self._first.get(key, False)
        if first is False:
            first = self._first[key] = self._earliest(nodes, request)
        return first if first is not None and first.start < end else None

    def _earliest(self, nodes: list[Node], request: Request) -> Window | None:
        # Every window kept ends after now: the earliest-starting one is the first in the way.
        found = None
        for node in nodes:
            if node.need(request.mig_profile, request.device_match):
                for window in self.by_node.get(node.name, ())[:1]:
                    if found is None or window.start < found.start:
                        found = window
        return found


def maintenance_detail(window: Window) -> str:
    """ "maintenance window 3 (firmware) on gpu-a from 2026-12-05 10:00 to 12:00 UTC" """
    start = datetime.fromtimestamp(window.start, UTC)
    end = datetime.fromtimestamp(window.end, UTC)
    until = f"{end:%H:%M}" if end.date() == start.date() else f"{end:%Y-%m-%d %H:%M}"
    names = ", ".join(window.nodes)
    if len(names) > 80:
        names = f"{len(window.nodes)} nodes"
    reason = window.reason if len(window.reason) <= 100 else window.reason[:99] + "…"
    why = f" ({reason})" if reason else ""
    return (
        f"maintenance window {window.id}{why} on {names} from {start:%Y-%m-%d %H:%M} to {until} UTC"
    )


def _free_before(
    node: Node, timeline: NodeTimeline, mask: int, request: Request, moment: float
) -> bool:
    """Whether ``request`` could hold the devices ``mask`` of ``node`` on ``timeline`` just
    before ``moment``."""
    just_before = math.nextafter(moment, -math.inf)
    if request.fractional:
        bit = mask.bit_length() - 1
        return sharing.room_at(timeline, bit, node.devices[bit], request, just_before)
    return timeline.free_mask(just_before, moment) & mask == mask


def _copy(timeline: NodeTimeline) -> NodeTimeline:
    return timeline.copy()
