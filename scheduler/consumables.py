"""Two consumables in use over time, a step function from ``now`` on: a shared GPU's compute
and memory (``sharing.ShareTimeline``), a node's CPU cores and host memory (``NodeTimeline.res``).

Segment i covers [times[i], times[i+1]) (the last one runs forever) with ``compute[i]`` of the
first resource and ``memory[i]`` of the second in use; ``cap`` and ``cap_memory`` are what there
is of each. Occupying only adds, so an earliest start never moves earlier during a pass.
"""

from __future__ import annotations

from bisect import bisect_right

INF = float("inf")


class Consumables:
    """Use of two consumables of one holder (a GPU, a node) from ``now`` on."""

    __slots__ = ("times", "compute", "memory", "cap", "cap_memory")

    def __init__(self, now: float, cap: float, cap_memory: float) -> None:
        self.times, self.compute, self.memory = [now], [0], [0]
        self.cap, self.cap_memory = cap, cap_memory

    def copy(self) -> Consumables:
        """An independent copy."""
        twin = Consumables(self.times[0], self.cap, self.cap_memory)
        twin.times, twin.compute, twin.memory = (
            list(self.times),
            list(self.compute),
            list(self.memory),
        )
        return twin

    def _split(self, t: float) -> int:
        times = self.times
        if t >= INF:
            return len(times)
        if t <= times[0]:
            return 0
        i = bisect_right(times, t) - 1
        if times[i] == t:
            return i
        times.insert(i + 1, t)
        self.compute.insert(i + 1, self.compute[i])
        self.memory.insert(i + 1, self.memory[i])
        return i + 1

    def add(self, compute: float, memory: float, start: float, end: float) -> None:
        """Hold ``compute`` and ``memory`` over [start, end) (negative: give them back)."""
        if end <= self.times[0] or end <= start:
            return
        first, last = self._split(max(start, self.times[0])), self._split(end)
        for i in range(first, last):
            self.compute[i] += compute
            self.memory[i] += memory

    def _room(self, i: int, compute: float, memory: float) -> bool:
        return self.compute[i] + compute <= self.cap and self.memory[i] + memory <= self.cap_memory

    def _index(self, t: float) -> int:
        return max(0, bisect_right(self.times, t) - 1)

    def earliest(
        self, compute: float, memory: float, duration: float, not_before: float, latest=INF
    ):
        """Earliest t >= not_before with room for both over [t, t + duration), or None
        (also when it would be later than ``latest``: a search that has a start stops there)."""
        times, n = self.times, len(self.times)
        i = self._index(not_before)
        while i < n:
            if not self._room(i, compute, memory):
                i += 1
                continue
            start = max(times[i], not_before)
            if start > latest:
                return None
            j = i + 1
            while j < n and times[j] < start + duration and self._room(j, compute, memory):
                j += 1
            if j >= n or times[j] >= start + duration:
                return start
            i = j + 1
        return None

    def fits(self, compute: float, memory: float, start: float, end: float) -> bool:
        """Whether both have room over all of [start, end)."""
        i = self._index(start)
        while True:
            if not self._room(i, compute, memory):
                return False
            i += 1
            if i >= len(self.times) or self.times[i] >= end:
                return True

    def free_until(self, compute: float, memory: float, start: float) -> float | None:
        """The latest end with room for both over [start, end) (None: none at start)."""
        i = self._index(start)
        if not self._room(i, compute, memory):
            return None
        for j in range(i + 1, len(self.times)):
            if not self._room(j, compute, memory):
                return self.times[j]
        return INF

    def peak(self, start: float, end: float) -> tuple[float, float]:
        """The most of each in use at once over [start, end)."""
        first = i = self._index(start)
        compute, memory = 0, 0
        while i < len(self.times) and (i == first or self.times[i] < end):
            compute, memory = max(compute, self.compute[i]), max(memory, self.memory[i])
            i += 1
        return compute, memory

    def left_at(self, t: float) -> tuple[float, float]:
        """(compute, memory) still free at instant ``t``."""
        i = self._index(t)
        return self.cap - self.compute[i], self.cap_memory - self.memory[i]
