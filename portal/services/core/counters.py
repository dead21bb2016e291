"""Shared counters (in the cache, Redis) that the work adds to and /metrics reads.

Recording is best effort: a metric must never fail the work it measures. The collectors that
turn these into Prometheus families live in portal/services/reporting/metrics.py; this module is
in core so that locking, the pass and ingest can count without importing reporting.
"""

from __future__ import annotations

import logging
import time

from django.core.cache import cache

log = logging.getLogger(__name__)

_PREFIX = "metrics:"
# Upper bounds (seconds) of the allocation-pass histogram's buckets.
PASS_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.0, 3.0, 5.0, 10.0, 30.0, 60.0)
_LAST_PASS = "pass:last"


def counter_add(name: str, amount: int = 1) -> None:
    """Add to a shared counter (created at 0 on first use)."""
    key = _PREFIX + name
    try:
        try:
            cache.incr(key, amount)
        except ValueError:  # not there yet
            if not cache.add(key, amount, timeout=None):
                cache.incr(key, amount)
    except Exception as exc:  # Redis down: the counter misses this, the work goes on
        log.debug("metric %s not recorded: %s", name, exc)


def pass_observe(seconds: float) -> None:
    """Record one allocation pass's duration (into the first bucket it fits) and its time."""
    bucket = next((str(le) for le in PASS_BUCKETS if seconds <= le), "inf")
    counter_add(f"pass:bucket:{bucket}")
    counter_add("pass:sum_us", int(seconds * 1_000_000))
    try:
        cache.set(_PREFIX + _LAST_PASS, time.time(), timeout=None)
    except Exception as exc:
        log.debug("last pass time not recorded: %s", exc)


def last_pass_at() -> float | None:
    """Unix time of the last allocation pass that ran, or None."""
    return cache.get(_PREFIX + _LAST_PASS)


def counter_values(names: list[str]) -> dict[str, int]:
    """Several shared counters' values (a counter never added to is absent)."""
    found = cache.get_many([_PREFIX + name for name in names])
    return {key.removeprefix(_PREFIX): int(value) for key, value in found.items()}


def counter_value(name: str) -> int:
    """A shared counter's value (0 before its first use)."""
    return counter_values([name]).get(name, 0)
