"""How much a refusal costs: seconds and traced memory, under an address-space cap.

A parser that expands a huge spec before bounding it (`0-99999999999999999999` as a set of
ids) would take the machine's memory; the cap makes such a regression a quick MemoryError in
the test instead, and `tracemalloc`'s peak shows the spec was never expanded.
"""

from __future__ import annotations

import contextlib
import os
import resource
import time
import tracemalloc
from dataclasses import dataclass

# What refusing one request may trace at its peak, and take: a Django request with its
# database round trips stays far below both; expanding a 10**20-task range does not.
PEAK_MAX = 4 * 1024 * 1024
SECONDS_MAX = 1.0
CAP = 512 * 1024 * 1024  # address space allowed above what the process has now


@dataclass
class Cost:
    seconds: float = 0.0
    peak: int = 0

    def cheap(self, seconds_max: float = SECONDS_MAX) -> bool:
        return self.seconds < seconds_max and self.peak < PEAK_MAX


def _address_space() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")


@contextlib.contextmanager
def measured():
    """Yield a Cost filled in on exit: wall seconds and the traced peak of the block."""
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    cap = _address_space() + CAP
    resource.setrlimit(
        resource.RLIMIT_AS, (cap if hard == resource.RLIM_INFINITY else min(cap, hard), hard)
    )
    cost = Cost()
    tracemalloc.start()
    start = time.monotonic()
    try:
        yield cost
    finally:
        cost.seconds = time.monotonic() - start
        cost.peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
