"""Side effects of booking changes, sent only after the transaction commits.

Emails, Slack, agent dispatch, live updates and the next allocation pass are slow or external:
they must never run inside the transaction that made the change (STYLE.md principle 4). They run
`robust`: one that fails (broker or Redis down) is logged, and the request that committed the
change still succeeds; an error there would make clients retry a write that happened.
"""

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

    booking_id = booking.pk
    transaction.on_commit(lambda: tasks.booking_event.delay(booking_id, event), robust=True)
    if event in _QUEUE_EVENTS:
        request_allocation_pass()


def request_allocation_pass() -> None:
    """Ask for an allocation pass after commit (Celery, or in-process in embedded mode)."""
    from portal import tasks

    transaction.on_commit(lambda: tasks.allocation_pass.delay(), robust=True)
