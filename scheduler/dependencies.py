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
MAX_DEPENDENCIES = 32


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


def _range(part: str) -> range:
    body, _, step_text = part.partition(":")
    first, dash, last = body.partition("-")
    try:
        lo = int(first)
        hi = int(last) if dash else lo
        step = int(step_text) if step_text else 1
    except ValueError:
        raise ArraySpecError(f"{part!r} is not N, N-M or N-M:S") from None
    if lo < 0 or hi < lo or step < 1:
        raise ArraySpecError(f"{part!r} must count up from 0 or more, with a step of 1 or more")
    return range(lo, hi + 1, step)


def parse_array(spec: str) -> ArraySpec:
    """Parse ``0-99%10``-style specs (Slurm's ``--array``); raise ArraySpecError saying why."""
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
        if not limit_text.isdigit() or int(limit_text) < 1:
            raise ArraySpecError("the running limit after % must be a whole number of 1 or more")
        limit = int(limit_text)
    return ArraySpec(tuple(sorted(ids)), limit)


def parse_dependency(text: str, *, numeric: bool = True) -> tuple[Dependency, ...]:
    """Parse ``afterok:41:42,afterany:43`` (Slurm's ``--dependency``; a bare id is afterok).

    Raises ValueError saying which part is wrong. With ``numeric`` (the portal's booking ids)
    ids must be whole numbers; a trace's job ids are any word.
    """
    deps: list[Dependency] = []
    for part in text.split(","):
        part = part.strip()
        kind, colon, ids = part.partition(":")
        if not colon:
            kind, ids = AFTER_OK, part
        if kind not in AFTER_KINDS:
            raise ValueError(f"{kind!r} is not one of {', '.join(AFTER_KINDS)}")
        for booking_id in ids.split(":"):
            if not booking_id or (numeric and not booking_id.isdigit()):
                raise ValueError(f"{booking_id!r} in {part!r} is not a booking id")
            deps.append(Dependency(kind, str(int(booking_id)) if numeric else booking_id))
    if len(deps) > MAX_DEPENDENCIES:
        raise ValueError(f"at most {MAX_DEPENDENCIES} dependencies")
    return tuple(dict.fromkeys(deps))
