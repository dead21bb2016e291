"""Side effects of booking changes, sent only after the transaction commits.

Emails, Slack, agent dispatch, live updates and the next allocation pass are slow or external:
they must never run inside the transaction that made the change (STYLE.md principle 4). They run
`robust`: one that fails (broker or Redis down) is logged, and the request that committed the
change still succeeds; an error there would make clients retry a write that happened.
"""

import math

from django.conf import settings
from django.core.cache import cache
from django.db import transaction

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


def booking_changed(booking, event: str) -> None:
    """Queue the side effects of `event` on `booking` for after commit."""
    from portal import tasks
    from portal.services.notifications import booking_event_record

    booking_id = booking.pk
    # Recorded in the transaction of the change, so a message is never lost nor sent for a
    # change that rolled back; sent after commit (portal.services.delivery).
    booking_event_record(booking_id=booking_id, event=event)
    transaction.on_commit(lambda: tasks.booking_event.delay(booking_id, event), robust=True)
    if event in _QUEUE_EVENTS:
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
    from portal import tasks

    window = settings.SCHEDULER_PASS_COALESCE_S
    if window <= 0:
        tasks.allocation_pass.delay()
        return
    if cache.add(PASS_REQUEST_KEY, 1, timeout=math.ceil(window)):
        tasks.allocation_pass.apply_async(countdown=window)
