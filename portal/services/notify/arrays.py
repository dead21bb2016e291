"""A job array is told as one: when it is submitted (with its number of tasks), when its first
task starts, and when all its tasks have ended (how many finished, failed, were cancelled).

A task's own events are told one by one only if its owner asked for that
(NotificationContact.array_each_task); a bulk command (cancelling the whole array) is told in
one message whatever they asked. Each message is recorded under a key naming the array, so
tasks that start or end side by side record it once. What goes to the owner goes on every
channel they chose (mail, Slack, webhook) and to the project's channel alike: the grouping is
the notification's, not a channel's.
"""

from dataclasses import dataclass

from django.db.models import Q

from portal.models import Booking, Event, Notification, NotificationContact
from portal.services.booking.arrays import array_states

# Booking service events that end a task; "requeued" does not (the task waits again).
_ENDS = {"finished", "released", "cancelled", "expired", "failed", "preempted"}
# The events told for the array instead of for its tasks (others, such as "extended", which
# the owner does to one task, are told for that task).
GROUPED = _ENDS | {"submitted", "started", "requeued"}


def tasks_told_alone() -> Q:
    """Bookings whose own events are told one by one: no array task, or its owner asked."""
    return Q(array_parent__isnull=True) | Q(owner__notification_contact__array_each_task=True)


def array_grouped(booking: Booking, event: str, *, bulk: str = "") -> bool:
    """Whether `event` of `booking` is told as part of its array's messages."""
    if booking.array_parent_id is None or event not in GROUPED:
        return False
    if bulk:
        return True
    each = NotificationContact.objects.filter(user_id=booking.owner_id, array_each_task=True)
    return not each.exists()


@dataclass(frozen=True)
class ArrayNote:
    """The array's notification a task's event gives: its event, key and context, about the
    array's first task (whose id names the array)."""

    event: str
    key: str
    context: dict
    booking: Booking


def array_note(booking: Booking, event: str, *, bulk: str = "") -> ArrayNote | None:
    """The array's notification `event` of its task `booking` gives (None: nothing to tell,
    such as a task ending while others still run)."""
    array_id = booking.array_parent_id
    if event == "submitted":
        what = {"tasks": Booking.objects.filter(array_parent_id=array_id).count()}
        return _note(array_id, Event.QUEUED, "submitted", what)
    if event == "started":
        return _note(
            array_id, Event.STARTED, "started", {"task": booking.array_task_id, "of": booking.pk}
        )
    if event not in _ENDS or Notification.objects.filter(key=_key(array_id, "ended")).exists():
        return None
    states = array_states(array_id=array_id)
    if any(state in Booking.LIVE_STATES for state in states):
        return None  # tasks still to end: told when the last one does
    what = {"states": states, "tasks": sum(states.values()), "bulk": bulk}
    # Told as a failure when a task failed, so one who hears only of failures hears of it.
    kind = Event.FAILED if states.get(Booking.State.FAILED) else Event.ENDED
    return _note(array_id, kind, "ended", what)


def _key(array_id: int, what: str) -> str:
    return f"array:{array_id}:{what}"


def _note(array_id: int, event: str, what: str, context: dict) -> ArrayNote:
    first = Booking.objects.select_related("owner", "project").get(pk=array_id)
    return ArrayNote(event, _key(array_id, what), {"array": {"what": what, **context}}, first)
