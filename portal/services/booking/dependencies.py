"""Job arrays and dependencies between bookings: checks at submit, outcomes for the pass.

The scheduling rules are the pure allocator's (``scheduler.dependencies``): this module turns
the user's ``array`` and ``after`` into rows and refusals that name the field, and tells the
pass how each target ended. A target ended successfully when it finished; every other end
(failed, cancelled, preempted for good, expired) is unsuccessful (Slurm's afterok/afternotok).
"""

from dataclasses import dataclass

from portal.errors import ValidationFailed
from portal.models import Booking, BookingDependency
from portal.services.booking.booking_rules import BookingRequest
from portal.services.booking.selectors import visible_bookings
from scheduler.dependencies import (
    MAX_DEPENDENCIES,
    ArraySpec,
    ArraySpecError,
    dependency_verdict,
    parse_array,
    parse_dependency,
    whole_number,
)
from scheduler.types import OUTCOME_NOT_OK, OUTCOME_OK, Dependency

State = Booking.State
# Dependency rows one submission may write (each task of an array has every dependency).
MAX_DEPENDENCY_ROWS = 20_000


def dependency_outcome(state: str) -> str | None:
    """How a booking in ``state`` ended, for its dependents (None: it has not ended)."""
    if state in Booking.LIVE_STATES:
        return None
    return OUTCOME_OK if state == State.FINISHED else OUTCOME_NOT_OK


def array_check(spec: str | None) -> ArraySpec | None:
    """The parsed ``array`` field, or a 400 naming it (None: not an array)."""
    if not spec:
        return None
    limit = Booking._meta.get_field("array_spec").max_length
    if len(spec.strip()) > limit:
        raise ValidationFailed.field("array", f"at most {limit} characters.")
    try:
        return parse_array(spec)
    except ArraySpecError as exc:
        raise ValidationFailed.field("array", f"{exc} (e.g. 0-99%10).") from None


def array_limit(spec: str) -> int | None:
    """The running limit of a stored array spec (``%N``), read by each pass without parsing
    the task list; None: no limit."""
    _, _, limit = spec.partition("%")
    return whole_number(limit)


@dataclass(frozen=True)
class After:
    """Checked dependencies: the rows to write (kind, target id) once the booking exists."""

    pairs: tuple[tuple[str, int], ...] = ()
    waiting: str = ""  # why it would wait now ("": every dependency is met already)

    def rows(self, booking: Booking) -> list[BookingDependency]:
        """Unsaved dependency rows of ``booking``."""
        return [
            BookingDependency(booking=booking, target_id=target, kind=kind)
            for kind, target in self.pairs
        ]


def after_check(*, user, after: str | list[str] | None) -> After:
    """The ``after`` field (``afterok:41,afterany:42`` or a list of such parts) checked: each
    target is a booking the user may see, named once, and not already ended in a way that
    means the dependency can never be met. Refusals are 400s naming ``after``."""
    if not after:
        return After()
    text = after if isinstance(after, str) else ",".join(str(part) for part in after)
    try:
        deps = parse_dependency(text)
    except ValueError as exc:
        raise ValidationFailed.field(
            "after", f"{exc}; write kind:id[:id], e.g. afterok:41,afterany:42."
        ) from None
    if len({dep.booking_id for dep in deps}) != len(deps):
        raise ValidationFailed.field("after", "names a booking twice.")
    if len(deps) > MAX_DEPENDENCIES:
        raise ValidationFailed.field("after", f"at most {MAX_DEPENDENCIES} bookings.")
    ids = [int(dep.booking_id) for dep in deps]
    states = dict(visible_bookings(user).filter(pk__in=ids).values_list("pk", "state"))
    missing = [str(pk) for pk in ids if pk not in states]
    if missing:
        raise ValidationFailed.field("after", f"no booking {', '.join(missing)} among yours.")
    deps, states = _with_array_tasks(deps, states)
    outcomes = {str(pk): o for pk, s in states.items() if (o := dependency_outcome(s))}
    verdict = dependency_verdict(deps, outcomes)
    if verdict is not None and verdict.never:
        raise ValidationFailed.field("after", f"{verdict.detail}, so it could never start.")
    pairs = tuple((dep.kind, int(dep.booking_id)) for dep in deps)
    return After(pairs, verdict.detail if verdict is not None else "")


def _with_array_tasks(deps: tuple[Dependency, ...], states: dict[int, str]):
    """An array's first task stands for the whole array (as Slurm's array job id does): a
    dependency on it is one on each of its tasks, with the same kind."""
    tasks = Booking.objects.filter(array_parent_id__in=states).exclude(pk__in=states)
    rows = list(tasks.values_list("array_parent_id", "pk", "state"))
    if not rows:
        return deps, states
    kinds = {int(dep.booking_id): dep.kind for dep in deps}
    more = tuple(Dependency(kinds[parent], str(pk)) for parent, pk, _ in rows)
    return deps + more, {**states, **{pk: state for _, pk, state in rows}}


def queued_only_check(request: BookingRequest, *, command, interactive, array, after: After):
    """Arrays and dependencies are for queued batch work: no fixed window, no session; an
    array needs a command. Refusals are 400s naming the field."""
    for name, asked in (("array", array is not None), ("after", bool(after.pairs))):
        if asked and request.start is not None:
            raise ValidationFailed.field(name, "only a queued booking (no start/end) can have it.")
        if asked and interactive not in (None, "", Booking.Interactive.NONE):
            raise ValidationFailed.field(name, "an interactive session cannot have it.")
    if array is not None and not command:
        raise ValidationFailed.field("array", "an array runs a command per task: give one.")
    if array is not None and len(array.task_ids) * len(after.pairs) > MAX_DEPENDENCY_ROWS:
        raise ValidationFailed.field(
            "after",
            f"an array's tasks times its dependencies may be at most {MAX_DEPENDENCY_ROWS}.",
        )


def array_save(booking: Booking, spec: str, task_ids: tuple[int, ...], after: After) -> None:
    """Save one booking per task, all pointing at the first (this one, saved first: a row
    names itself as parent only once it exists), each with the same dependencies."""
    booking.save()
    fields = {"array_parent_id": booking.pk, "array_task_id": task_ids[0], "array_spec": spec}
    Booking.objects.filter(pk=booking.pk).update(**fields)
    for name, value in fields.items():
        setattr(booking, name, value)
    tasks = [booking]
    for task_id in task_ids[1:]:
        task = _copy_request(booking)
        task.array_parent_id, task.array_task_id, task.array_spec = booking.pk, task_id, spec
        tasks.append(task)
    Booking.objects.bulk_create(tasks[1:])
    BookingDependency.objects.bulk_create(row for task in tasks for row in after.rows(task))


def _copy_request(booking: Booking) -> Booking:
    names = (
        "owner_id project_id gpus mig_profile gpu_model mixed_models duration_s qos preemptible"
        " command"
        " image workdir env signal_name signal_before_s state submitted_at"
        " gpu_fraction gpu_memory_mib"
    ).split()
    return Booking(**{name: getattr(booking, name) for name in names})


def pending_dependencies() -> tuple[dict[int, tuple[Dependency, ...]], dict[str, str]]:
    """For the pass, in one query: each pending booking's dependencies, and how each of
    their ended targets ended."""
    deps: dict[int, list[Dependency]] = {}
    outcomes: dict[str, str] = {}
    rows = BookingDependency.objects.filter(booking__state=State.PENDING).values_list(
        "booking_id", "kind", "target_id", "target__state"
    )
    for booking_id, kind, target_id, target_state in rows.order_by("booking_id", "target_id"):
        deps.setdefault(booking_id, []).append(Dependency(kind, str(target_id)))
        outcome = dependency_outcome(target_state)
        if outcome is not None:
            outcomes[str(target_id)] = outcome
    return {pk: tuple(found) for pk, found in deps.items()}, outcomes
