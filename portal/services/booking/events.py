"""Booking facts, and the allocation pass they ask for.

A booking command calls `booking_changed` inside its transaction: it records one fact (an outbox
row, portal.services.core.outbox) and nothing else. Notifications, live updates, agent pushes and the
next allocation pass are the fact's subscribers (registered in PortalConfig.ready); they run after
commit, each in its own transaction, and one that fails (broker or Redis down) is logged and
retried by the outbox sweep, while the request that committed the change still succeeds.

The fact carries its cause, so no subscriber asks another module why a booking changed: the
command's caller names it when it knows better (`caused_by("reclaim")` around the idle
reclaim's release, `caused_by("link")` around a one-click link), else the call site does
("owner" for a person's own command, "site" for the pass, a node failure or an agent's report).
"""

import math
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

from django.conf import settings
from django.core.cache import cache
from django.db import transaction

from portal.services.core.jobs import job_enqueue
from portal.services.core.outbox import fact_record

BOOKING_CHANGED = "booking_changed"
NODE_DOWN = "node_down"
# A node came up, was drained or returned, or registered its devices: the queue may move.
NODE_CHANGED = "node_changed"
# The pass stored new planned starts or positions: open queue pages refresh.
QUEUE_CHANGED = "queue_changed"

# Events after which the queue may move: ask for an allocation pass.
_QUEUE_EVENTS = {
    "submitted",
    "cancelled",
    "released",
    "extended",
    "finished",
    "failed",
    "node_changed",
}

_cause: ContextVar[str] = ContextVar("booking_change_cause", default="")


@contextmanager
def caused_by(cause: str) -> Iterator[None]:
    """Name the cause of the booking changes a command makes in this block."""
    token = _cause.set(cause)
    try:
        yield
    finally:
        _cause.reset(token)


def booking_changed(booking, event: str, *, cause: str = "site", bulk: str = "") -> None:
    """Record the fact that `booking` changed by `event` (in the caller's transaction).

    `bulk` names the one command that changed many bookings at once ("array_cancel"): its
    facts are told together, in one message (portal.services.notify.arrays)."""
    payload = {"event": event, "cause": _cause.get() or cause}
    if bulk:
        payload["bulk"] = bulk
    fact_record(kind=BOOKING_CHANGED, booking_id=booking.pk, payload=payload)


def node_changed(*, node_id: int, change: str) -> None:
    """Record that node `node_id` changed in a way that may move the queue (`change`: "up",
    "drain", "return" or "registered"), in the caller's transaction."""
    fact_record(kind=NODE_CHANGED, node_id=node_id, payload={"change": change, "cause": "site"})


def queue_changed(*, changed: int) -> None:
    """Record that the pass stored `changed` new plans (planned starts, positions, reasons)."""
    fact_record(kind=QUEUE_CHANGED, payload={"changed": changed, "cause": "site"})


def node_fact_pass_request(fact) -> None:
    """Subscriber: a node that came up, went down, was drained, returned or registered asks for
    an allocation pass (what fits where may have changed)."""
    request_allocation_pass()


def booking_fact_pass_request(fact) -> None:
    """Subscriber: a change after which the queue may move asks for an allocation pass."""
    if fact.payload.get("event") in _QUEUE_EVENTS:
        request_allocation_pass()


PASS_REQUEST_KEY = "scheduler:pass-requested"


def request_allocation_pass() -> None:
    """Ask for an allocation pass after commit (Celery, or in-process in embedded mode).

    Requests coalesce: the first change in a window of SCHEDULER_PASS_COALESCE_S queues one
    pass to run at the window's end, and later changes in the window ride on it (it reads the
    database after they committed). A burst of submissions gives a few passes, not one each.
    """
    transaction.on_commit(_queue_pass, robust=True)


def _queue_pass() -> None:
    window = settings.SCHEDULER_PASS_COALESCE_S
    if window <= 0:
        job_enqueue("allocation_pass")
        return
    if cache.add(PASS_REQUEST_KEY, 1, timeout=math.ceil(window)):
        job_enqueue("allocation_pass", countdown=window)
