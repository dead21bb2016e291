"""Free-capacity timeline of one node: a step function of bitmasks of free devices.

Segment i covers [times[i], times[i+1]) (the last one runs forever) and ``masks[i]`` has bit b set
when the node's device b is free for the whole segment. Occupying only clears bits, so the earliest
start of any request on a node never moves earlier during a pass: callers may cache it as a lower
bound and resume a search from there. A shared GPU's fractions are not bits: ``shares`` holds a
``sharing.ShareTimeline`` for each shared device (by bit) that something holds. CPU cores and
host memory are not bits either: on a node whose capacity is known, ``res`` holds what is in use
(``consumables.Consumables``) and every search and check that takes a demand (cores, memory)
finds devices and room for both over the same window (None: the node counts GPUs alone).
"""

from __future__ import annotations

from bisect import bisect_right

from scheduler.consumables import Consumables

INF = float("inf")


class NodeTimeline:
    """Per-device free time of one node, from ``now`` on."""

    __slots__ = ("times", "masks", "version", "shares", "res")

    def __init__(self, now: float, full_mask: int, capacity=None) -> None:
        self.times = [now]
        self.masks = [full_mask]
        self.version = 0
        self.shares: dict = {}
        # Cores and memory in use (None: unknown, GPUs alone); ``capacity``: NodeResources.
        self.res = (
            None if capacity is None else Consumables(now, capacity.cpus, capacity.memory_mib)
        )

    def copy(self) -> NodeTimeline:
        """An independent copy (devices, shares, cores and memory)."""
        twin = NodeTimeline(self.times[0], 0)
        twin.times, twin.masks = list(self.times), list(self.masks)
        twin.shares = {bit: shares.copy() for bit, shares in self.shares.items()}
        twin.res = None if self.res is None else self.res.copy()
        return twin

    def hold(self, cpus: int, memory: int, start: float, end: float) -> None:
        """Hold ``cpus`` cores and ``memory`` MiB over [start, end) (negative: give them back);
        nothing on a node of unknown capacity."""
        if self.res is not None and (cpus or memory):
            self.res.add(cpus, memory, start, end)
            self.version += 1

    def room(self, cpus: int, memory: int, start: float, end: float) -> bool:
        """Whether ``cpus`` cores and ``memory`` MiB are free over all of [start, end)."""
        if self.res is None or not (cpus or memory):
            return True
        return self.res.fits(cpus, memory, start, max(end, start + 1e-9))

    def hold_share(self, bit: int, shares, compute: float, memory: int, start: float, end: float):
        """Hold ``compute`` and ``memory`` of shared device ``bit`` over [start, end)
        (negative: give them back); ``shares`` is its share timeline (``sharing``)."""
        self.shares[bit] = shares
        shares.add(compute, memory, start, end)
        self.version += 1

    def _split(self, t: float) -> int:
        """Index of the segment that starts at ``t``, creating it if needed."""
        times = self.times
        if t >= INF:
            return len(times)
        if t <= times[0]:
            return 0
        i = bisect_right(times, t) - 1
        if times[i] == t:
            return i
        times.insert(i + 1, t)
        self.masks.insert(i + 1, self.masks[i])
        return i + 1

    def occupy(self, bits: int, start: float, end: float) -> None:
        """Mark devices ``bits`` busy over [start, end)."""
        if end <= self.times[0] or end <= start:
            return
        first = self._split(start)
        last = self._split(end)
        keep = ~bits
        masks = self.masks
        for i in range(first, last):
            masks[i] &= keep
        self.version += 1

    def release(self, bits: int, start: float, end: float) -> None:
        """Mark devices ``bits`` free again over [start, end) (a preempted booking's hold)."""
        if end <= self.times[0] or end <= start:
            return
        first = self._split(start)
        last = self._split(end)
        masks = self.masks
        for i in range(first, last):
            masks[i] |= bits
        self.version += 1

    def mask_at(self, t: float) -> int:
        """Devices free at instant ``t``."""
        return self.masks[max(0, bisect_right(self.times, t) - 1)]

    def free_mask(self, start: float, end: float) -> int:
        """Devices free over all of [start, end)."""
        times, masks = self.times, self.masks
        i = max(0, bisect_right(times, start) - 1)
        mask = masks[i]
        i += 1
        while i < len(times) and times[i] < end and mask:
            mask &= masks[i]
            i += 1
        return mask

    def free_until(
        self, need: int, count: int, start: float, demand: tuple[int, int] = (0, 0)
    ) -> float | None:
        """The latest end such that ``count`` devices of ``need`` and ``demand`` (cores,
        memory) are free over all of [start, end) (None: not free at ``start`` itself; inf:
        never taken)."""
        end = self._free_until(need, count, start)
        if end is None or self.res is None or not (demand[0] or demand[1]):
            return end
        room = self.res.free_until(demand[0], demand[1], start)
        return None if room is None else min(end, room)

    def _free_until(self, need: int, count: int, start: float) -> float | None:
        times, masks = self.times, self.masks
        i = max(0, bisect_right(times, start) - 1)
        mask = masks[i] & need
        if mask.bit_count() < count:
            return None
        for j in range(i + 1, len(times)):
            mask &= masks[j]
            if mask.bit_count() < count:
                return times[j]
        return INF

    def earliest(
        self,
        need: int,
        count: int,
        duration: float,
        not_before: float,
        demand: tuple[int, int] = (0, 0),
    ):
        """Earliest t >= not_before with ``count`` devices of ``need`` and ``demand`` (cores,
        memory) free over [t, t+duration): the one search every phase places with.

        Returns (t, mask of those free devices), or None when the node never has them.
        """
        found = self._earliest(need, count, duration, not_before)
        res = self.res
        if found is None or res is None or not (demand[0] or demand[1]):
            return found
        cpus, memory = demand
        while True:
            # Each side's earliest from the other's: both only move later, to a common start.
            start = res.earliest(cpus, memory, duration, found[0])
            if start is None:
                return None
            if start == found[0]:
                return found
            found = self._earliest(need, count, duration, start)
            if found is None:
                return None
            if found[0] == start:
                return found

    def _earliest(self, need: int, count: int, duration: float, not_before: float):
        times, masks = self.times, self.masks
        n = len(times)
        i = bisect_right(times, not_before) - 1
        if i < 0:
            i = 0
        while i < n:
            mask = masks[i] & need
            if mask.bit_count() >= count:
                start = times[i] if times[i] > not_before else not_before
                end = start + duration
                j = i + 1
                while j < n and times[j] < end:
                    mask &= masks[j]
                    if mask.bit_count() < count:
                        break
                    j += 1
                else:
                    return start, mask
                # Starts before segment j would still overlap it: jump past the blocker.
                i = j if (masks[j] & need).bit_count() < count else i + 1
                continue
            i += 1
        return None

    def earliest_instant(self, need: int, count: int, not_before: float) -> float | None:
        """Earliest t >= not_before at which ``count`` devices of ``need`` are free at all."""
        times, masks = self.times, self.masks
        i = max(0, bisect_right(times, not_before) - 1)
        for j in range(i, len(times)):
            if (masks[j] & need).bit_count() >= count:
                return max(times[j], not_before)
        return None
