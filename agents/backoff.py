"""Capped, jittered exponential backoff for reconnecting to the portal."""

from __future__ import annotations

import random
from collections.abc import Callable


class Backoff:
    """Delays of base * 2**n seconds, capped, each shrunk by up to half at random.

    The jitter keeps a whole site's agents from hammering a portal that just came back
    all in the same second.
    """

    def __init__(
        self, base_s: float = 1.0, cap_s: float = 60.0, rand: Callable[[], float] = random.random
    ) -> None:
        self._base_s = base_s
        self._cap_s = cap_s
        self._rand = rand
        self.failures = 0

    def next_delay(self) -> float:
        """Count one more failure and return how long to wait before the next try."""
        delay = min(self._cap_s, self._base_s * 2**self.failures)
        self.failures += 1
        return delay * (0.5 + self._rand() / 2)

    def reset(self) -> None:
        """Back to the shortest delay after a success."""
        self.failures = 0
