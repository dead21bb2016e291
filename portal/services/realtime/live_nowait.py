"""Fire-and-forget channel-layer sends from sync code, on one long-lived event loop.

`live.group_send` wraps each send in async_to_sync: a new event loop per call and, with the
Redis layer, new Redis connections per loop (about 7 ms a send on a small machine). Telemetry
broadcasts one message per readings batch, hundreds a second, so it sends from one daemon
thread's loop instead, which keeps its connections. Best effort: a message still queued when
the process exits is lost, which live views tolerate (the next batch follows in seconds).
The in-memory layer (embedded mode) belongs to the server's own loop: there it falls back.
"""

import asyncio
import logging
import os
import threading

from channels.layers import InMemoryChannelLayer, get_channel_layer

from portal.services.realtime import live

log = logging.getLogger(__name__)

_lock = threading.Lock()
_loop: asyncio.AbstractEventLoop | None = None
_loop_pid: int | None = None


def _sender_loop() -> asyncio.AbstractEventLoop:
    global _loop, _loop_pid
    with _lock:
        if _loop is None or _loop_pid != os.getpid():  # a forked worker needs its own thread
            _loop, _loop_pid = asyncio.new_event_loop(), os.getpid()
            threading.Thread(target=_loop.run_forever, name="live-nowait", daemon=True).start()
        return _loop


def live_send_nowait(group: str, message: dict) -> None:
    """Send `message` to `group` without waiting for it (call after commit, like group_send)."""
    layer = get_channel_layer()
    if layer is None:
        return
    if isinstance(layer, InMemoryChannelLayer):
        live.group_send(group, message)
        return
    future = asyncio.run_coroutine_threadsafe(layer.group_send(group, message), _sender_loop())
    future.add_done_callback(_log_failure)


def _log_failure(future) -> None:
    if not future.cancelled() and future.exception() is not None:
        log.warning("live send failed: %s", future.exception())
