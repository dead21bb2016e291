"""Free-capacity timeline of one node: a step function of bitmasks of free devices.

Segment i covers [times[i], times[i+1]) (the last one runs forever) and ``masks[i]`` has bit b set
when the node's device b is free for the whole segment. Occupying only clears bits, so the earliest
start of any request on a node never moves earlier during a pass: callers may cache it as a lower
bound and resume a search from there.
"""

from __future__ import annotations

from bisect import bisect_right

INF = float("inf")


class NodeTimeline:
    """Per-device free time of one node, from ``now`` on."""

    __slots__ = ("times", "masks", "version")

    def __init__(self, now: float, full_mask: int) -> None:
        self.times = [now]
        self.masks = [full_mask]
        self.version = 0

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

    def free_until(self, need: int, count: int, start: float) -> float | None:
        """The latest end such that ``count`` devices of ``need`` are free over all of
        [start, end) (None: not free at ``start`` itself; inf: never taken)."""
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

    def earliest(self, need: int, count: int, duration: float, not_before: float):
        """Earliest t >= not_before with ``count`` devices of ``need`` free over [t, t+duration).

        Returns (t, mask of those free devices), or None when the node never has them.
        """
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
