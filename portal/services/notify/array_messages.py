"""What a job array's messages say (portal.services.notify.arrays): submitted with its tasks,
its first task started, all ended with how many ended each way. The text of a single
booking's messages is in portal.services.notify.messages, which builds these too."""

from portal.models import Allocation, Booking
from portal.services.notify.messages import Message

State = Booking.State
# The ends counted, in the order they are told ("finished" includes released and reclaimed).
_ENDS = (
    (State.FINISHED, "finished"),
    (State.FAILED, "failed"),
    (State.CANCELLED, "cancelled"),
    (State.PREEMPTED, "preempted"),
    (State.EXPIRED, "expired"),
)


def array_message(first: Booking, array: dict) -> Message:
    """The message about the array named by its first task `first` (context `array`)."""
    build = {"submitted": _submitted, "started": _started, "ended": _ended}[array["what"]]
    return build(first, array)


def _limit(first: Booking) -> str:
    _, _, limit = first.array_spec.partition("%")
    return f", at most {limit} at once" if limit else ""


def _submitted(first: Booking, array: dict) -> Message:
    tasks = array.get("tasks", 0)
    return Message(
        f"Array {first.pk} submitted: {tasks} tasks",
        f"Your job array {first.array_spec} is queued: {tasks} tasks of "
        f"{first.describe_request()}{_limit(first)}. You hear again when its first task "
        f"starts and when all {tasks} have ended.",
        facts=[("Tasks", str(tasks)), ("Why it waits", first.state_detail or "-")],
    )


def _started(first: Booking, array: dict) -> Message:
    task = Booking.objects.filter(pk=array.get("of")).first()
    held = Allocation.objects.filter(booking=task).select_related("gpu__node")
    nodes = sorted({a.gpu.node.hostname for a in held})
    return Message(
        f"Array {first.pk}: its first task started",
        f"Task {array.get('task')} (booking {array.get('of')}) holds its devices on "
        f"{', '.join(nodes) or '-'}; the other tasks start as devices free up. You hear again "
        "when all have ended.",
        facts=[("Node", ", ".join(nodes) or "-")],
    )


def array_counts(states: dict) -> str:
    """ "8 finished, 1 failed, 1 cancelled": finished, failed and cancelled always, the other
    ends where there are any."""
    shown = [
        f"{states.get(state, 0)} {word}"
        for state, word in _ENDS
        if state in (State.FINISHED, State.FAILED, State.CANCELLED) or states.get(state)
    ]
    return ", ".join(shown)


def _ended(first: Booking, array: dict) -> Message:
    states, tasks = array.get("states", {}), array.get("tasks", 0)
    counts = array_counts(states)
    if array.get("bulk"):
        intro = f"You cancelled the array: all {tasks} tasks have ended ({counts})."
    else:
        intro = f"All {tasks} tasks of your array have ended: {counts}."
    return Message(
        f"Array {first.pk} ended: {counts}",
        intro,
        facts=[(word.capitalize(), str(states.get(state, 0))) for state, word in _ENDS],
    )
