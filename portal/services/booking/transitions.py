"""The one table of booking state transitions, and the compare-and-set that reads it.

Every write that changes ``Booking.state`` names only its target state; the table says which
states it may come from. A row count of 0 means the booking was not in one of them (someone else
moved it first), and the caller does nothing more. The database keeps ``state`` to the known
values (a CHECK constraint); this table keeps the moves between them.
"""

from portal.models import Booking

State = Booking.State

# from -> the states it may move to. Pending and planned are where a booking starts (submit);
# preempted and failed go back to pending when the site requeues a batch job.
TRANSITIONS: dict[str, frozenset[str]] = {
    State.PENDING: frozenset({State.ACTIVE, State.CANCELLED}),
    State.PLANNED: frozenset({State.ACTIVE, State.CANCELLED, State.FAILED}),
    State.ACTIVE: frozenset({State.FINISHED, State.CANCELLED, State.PREEMPTED, State.FAILED}),
    State.PREEMPTED: frozenset({State.PENDING}),
    State.FAILED: frozenset({State.PENDING}),
    State.FINISHED: frozenset(),
    State.CANCELLED: frozenset(),
    State.EXPIRED: frozenset(),
}


def transition_sources(to: str) -> tuple[str, ...]:
    """The states a booking may move to `to` from, sorted (for SQL and for stable queries)."""
    return tuple(sorted(source for source, targets in TRANSITIONS.items() if to in targets))


def booking_cas(booking_id: int, *, to: str, where: dict | None = None, **fields) -> bool:
    """Move one booking to `to` if the table allows it from its current state; False if not.

    ``where`` adds conditions of the caller's own (a start checks the duration it planned);
    ``fields`` are written with the state.
    """
    rows = Booking.objects.filter(pk=booking_id, state__in=transition_sources(to), **(where or {}))
    return bool(rows.update(state=to, **fields))
