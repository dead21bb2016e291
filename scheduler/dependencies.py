"""Dependencies between bookings and job arrays: the pure rules (no Django, no clock).

A pending booking with dependencies is eligible only once every target ended the way its kind
asks (``afterok``: successfully, ``afternotok``: not successfully, ``afterany``: either). A
target that ended the other way makes the dependency one that can never be met; so does a
target that is itself pending with such a dependency (it will be ended too), which is why the
verdicts are worked out to a fixed point.

An array spec is Slurm's: ``0-99%10`` (tasks 0 to 99, at most 10 running), ``1,3,5-7``,
``0-20:5`` (a step), each with an optional ``%limit``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from scheduler.types import (
    AFTER_KINDS,
    AFTER_NOT_OK,
    AFTER_OK,
    OUTCOME_NOT_OK,
    OUTCOME_OK,
    Dependency,
    Request,
)

MAX_ARRAY_TASKS = 1000  # tasks of one array (Slurm's MaxArraySize is 1001 by default)
MAX_ARRAY_SPEC = 200  # characters of a spec (Booking.array_spec)
MAX_ARRAY_TASK_ID = 2**31 - 1  # a task id's column (PositiveIntegerField)
MAX_DEPENDENCIES = 32
MAX_DEPENDENCY_TEXT = 2000  # characters of a booking's ``after`` (the API's and the form's bound)


@dataclass(frozen=True)
class Verdict:
    """Why a pending booking may not start: ``never`` when its dependencies can never be met."""

    never: bool
    detail: str


def _unmet(dep: Dependency, outcome: str) -> bool:
    return (dep.kind == AFTER_OK and outcome != OUTCOME_OK) or (
        dep.kind == AFTER_NOT_OK and outcome == OUTCOME_OK
    )


def _ended_how(outcome: str) -> str:
    return "ended successfully" if outcome == OUTCOME_OK else "did not end successfully"


def dependency_verdict(after: Iterable[Dependency], outcomes: Mapping[str, str]) -> Verdict | None:
    """Why a booking with these dependencies may not start yet (None: all met): the one rule,
    for the pass and for the check at submit."""
    waiting = []
    for dep in after:
        outcome = outcomes.get(dep.booking_id)
        if outcome is None:
            waiting.append(dep)
        elif _unmet(dep, outcome):
            return Verdict(
                True,
                f"dependency never satisfied: booking {dep.booking_id} {_ended_how(outcome)}"
                f" ({dep.kind})",
            )
    if not waiting:
        return None
    names = ", ".join(f"{dep.kind}:{dep.booking_id}" for dep in waiting)
    return Verdict(False, f"waits for {names}")


def dependency_verdicts(
    pending: Iterable[Request], outcomes: Mapping[str, str]
) -> dict[str, Verdict]:
    """Every pending booking that may not start because of its dependencies, with why.

    A booking absent from the answer has none, or all met. Targets not in ``outcomes`` are
    still live (pending or running); a pending target found never-met counts as not ended
    successfully, so a chain after a failed booking ends in one pass.
    """
    dependent = [request for request in pending if request.after]
    known = dict(outcomes)
    verdicts: dict[str, Verdict] = {}
    changed = True
    while changed:
        changed = False
        for request in dependent:
            previous = verdicts.get(request.booking_id)
            if previous is not None and previous.never:
                continue
            verdict = dependency_verdict(request.after, known)
            if verdict is None:
                verdicts.pop(request.booking_id, None)
                continue
            verdicts[request.booking_id] = verdict
            if verdict.never:
                known[request.booking_id] = OUTCOME_NOT_OK
                changed = True
    return verdicts


@dataclass(frozen=True)
class ArraySpec:
    """A parsed array spec: the task ids, in order, and the running limit (None: none)."""

    task_ids: tuple[int, ...]
    limit: int | None


class ArraySpecError(ValueError):
    """An array spec that cannot be parsed or is out of bounds; the message says why."""


def whole_number(text: str) -> int | None:
    """``text`` as a whole number if it is ASCII digits only, else None (``int()`` and
    ``str.isdigit`` also take other scripts' digits, such as ``"١٢"``)."""
    return int(text) if text.isascii() and text.isdigit() else None


def _range(part: str) -> range:
    body, _, step_text = part.partition(":")
    first, dash, last = body.partition("-")
    lo, hi, step = whole_number(first), whole_number(last) if dash else None, 1
    if step_text:
        step = whole_number(step_text)
    if lo is None or (dash and hi is None) or step is None:
        raise ArraySpecError(f"{part!r} is not N, N-M or N-M:S (digits 0-9)")
    hi = lo if hi is None else hi
    if hi < lo or step < 1:
        raise ArraySpecError(f"{part!r} must count up from 0 or more, with a step of 1 or more")
    # Counted before any id is made (len(range) itself overflows past sys.maxsize).
    if (hi - lo) // step + 1 > MAX_ARRAY_TASKS:
        raise ArraySpecError(f"an array has at most {MAX_ARRAY_TASKS} tasks")
    if hi > MAX_ARRAY_TASK_ID:
        raise ArraySpecError(f"a task id is at most {MAX_ARRAY_TASK_ID}")
    return range(lo, hi + 1, step)


def parse_array(spec: str) -> ArraySpec:
    """Parse ``0-99%10``-style specs (Slurm's ``--array``); raise ArraySpecError saying why.

    Each range is counted before its ids are made, so a spec of a huge range costs no memory.
    """
    if len(spec) > MAX_ARRAY_SPEC:
        raise ArraySpecError(f"an array spec is at most {MAX_ARRAY_SPEC} characters")
    body, percent, limit_text = spec.strip().partition("%")
    if not body:
        raise ArraySpecError("an array spec names task ids, e.g. 0-99%10")
    ids: set[int] = set()
    for part in body.split(","):
        ids.update(_range(part.strip()))
        if len(ids) > MAX_ARRAY_TASKS:
            raise ArraySpecError(f"an array has at most {MAX_ARRAY_TASKS} tasks")
    limit = None
    if percent:
        limit = whole_number(limit_text)
        if limit is None or limit < 1:
            raise ArraySpecError("the running limit after % must be a whole number of 1 or more")
    return ArraySpec(tuple(sorted(ids)), limit)


def parse_dependency(text: str, *, numeric: bool = True) -> tuple[Dependency, ...]:
    """Parse ``afterok:41:42,afterany:43`` (Slurm's ``--dependency``; a bare id is afterok).

    Raises ValueError saying which part is wrong. With ``numeric`` (the portal's booking ids)
    ids must be whole numbers; a trace's job ids are any word.
    """
    if numeric and len(text) > MAX_DEPENDENCY_TEXT:
        raise ValueError(f"at most {MAX_DEPENDENCY_TEXT} characters")
    deps: list[Dependency] = []
    for part in text.split(","):
        part = part.strip()
        kind, colon, ids = part.partition(":")
        if not colon:
            kind, ids = AFTER_OK, part
        if kind not in AFTER_KINDS:
            raise ValueError(f"{kind!r} is not one of {', '.join(AFTER_KINDS)}")
        for booking_id in ids.split(":"):
            number = whole_number(booking_id)
            if not booking_id or (numeric and number is None):
                raise ValueError(f"{booking_id!r} in {part!r} is not a booking id")
            deps.append(Dependency(kind, str(number) if numeric else booking_id))
            if len(deps) > MAX_DEPENDENCIES:  # counted as they come: a long text stops here
                raise ValueError(f"at most {MAX_DEPENDENCIES} dependencies")
    return tuple(dict.fromkeys(deps))
