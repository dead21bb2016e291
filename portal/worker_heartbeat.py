"""Celery workers say, every second, which queues they consume; /readyz reads it.

A worker killed (SIGKILL, OOM) stops saying so at once, so /readyz fails within
READY_WORKER_MAX_AGE_S (one pass interval by default) instead of waiting for the last
allocation pass to grow old.
"""

import threading
import time

from django.core.cache import cache

_EVERY_S = 1.0


def _key(queue: str) -> str:
    return f"worker-heartbeat:{queue}"


def heartbeat_start(queues: list[str]) -> threading.Thread:
    """In a worker's main process: a daemon thread writing the time for each of its queues."""

    def beat() -> None:
        while True:
            try:
                heartbeat_write(queues)
            except Exception:  # Redis away: no heartbeat, which is what /readyz should see
                pass
            time.sleep(_EVERY_S)

    thread = threading.Thread(target=beat, name="worker-heartbeat", daemon=True)
    thread.start()
    return thread


def heartbeat_write(queues: list[str]) -> None:
    """Say now that a worker consumes these queues."""
    now = time.time()
    cache.set_many({_key(q): now for q in queues}, timeout=600)


def heartbeat_age(queue: str) -> float | None:
    """Seconds since a worker consuming `queue` last said so; None when none ever did."""
    last = cache.get(_key(queue))
    return None if last is None else time.time() - last
