"""Commands on a whole job array: cancel every task that has not ended, in one call.

The tasks of an array share their owner and project, so the permission to cancel the first
task (whose id names the array) is the permission to cancel them all. Each task ends as a
single cancel ends it (compare-and-set, devices freed, an audit row, a fact), in one
transaction; the facts are marked as one bulk command, so the owner hears of it once.
"""

from dataclasses import dataclass
from datetime import datetime

from django.db import transaction
from django.db.models import Count

from portal.errors import InvalidState, NotFound
from portal.models import Booking
from portal.services.access.audit import SYSTEM, Source, audit_booking, booking_state
from portal.services.booking import events
from portal.services.booking.bookings import booking_transition
from portal.services.booking.selectors import booking_get_for_change

State = Booking.State
ARRAY_CANCEL = "array_cancel"  # the bulk command's name in its facts


@dataclass(frozen=True)
class ArrayCancelled:
    """What a cancel of an array did: the tasks it cancelled, and how many of the array's
    tasks ended each way (cancelled included)."""

    array_id: int
    cancelled: tuple[int, ...]
    states: dict[str, int]


def array_cancel(*, user, array_id: int, now: datetime, source: Source = SYSTEM) -> ArrayCancelled:
    """Cancel every task of array `array_id` (its first task's id) that is pending, planned
    or active; 404 if it names no array of the user's, 409 if no task is left to cancel."""
    first = booking_get_for_change(user=user, booking_id=array_id, action="booking.cancel")
    if first.array_parent_id != first.pk:
        raise NotFound(f"Booking {array_id} does not name a job array (its first task's id does).")
    tasks = Booking.objects.filter(array_parent_id=first.pk).select_related("project")
    cancelled = []
    with transaction.atomic(durable=True):
        for task in tasks.filter(state__in=Booking.LIVE_STATES).order_by("pk"):
            before = booking_state(task)
            if not booking_transition(task.pk, to=State.CANCELLED, now=now):
                continue  # it ended a moment ago on its own: its own fact tells it
            task.refresh_from_db()
            audit_booking(
                action="booking.cancel", booking=task, actor=user, source=source, before=before
            )
            events.booking_changed(task, "cancelled", cause="owner", bulk=ARRAY_CANCEL)
            cancelled.append(task.pk)
    if not cancelled:
        raise InvalidState(f"Array {first.pk} has no task left to cancel: all have ended.")
    return ArrayCancelled(first.pk, tuple(cancelled), array_states(array_id=first.pk))


def array_states(*, array_id: int) -> dict[str, int]:
    """How many tasks of the array are in each state."""
    rows = (
        Booking.objects.filter(array_parent_id=array_id)
        .order_by()
        .values("state")
        .annotate(count=Count("id"))
    )
    return {row["state"]: row["count"] for row in rows}
