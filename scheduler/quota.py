"""Quotas at allocation time: concurrent GPU-equivalents per user and project, GPU-hour budgets.

Concurrency is checked over the whole window a booking would hold, against running allocations,
advance reservations and everything planned earlier in the same pass, so planned starts respect
quotas too and a booking held back by quota gets the time its owner's use drops low enough.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace

from scheduler.types import Quota

_EPS = 1e-9

# The limits of cores and host memory a quota may set, as (field of Quota, unit in sentences).
HOST_LIMITS = (("max_cpus", "cores"), ("max_memory_mib", "MiB of memory"))


@dataclass(frozen=True)
class QuotaRefusal:
    """The limit a booking would break: its name, its value, what is held or used already and
    what the booking adds. Callers word it for their audience."""

    limit: str  # "max_gpus", "gpu_hours_budget", "max_cpus" or "max_memory_mib"
    limit_value: float
    usage: float
    asks: float
    scope: str = ""  # "user" (the user in the project) or "project", when known


@dataclass(frozen=True)
class QuotaSide:
    """Where a request stands against one quota key: the user in the project, or the project.

    ``quota`` holds the limits and the GPU-hours used in the budget period; ``held`` the most
    GPU-equivalents held at once over the request's window (0 without a window), and
    ``host_held`` the most cores and the most memory MiB held at once there (where the quota
    limits them).
    """

    scope: str  # "user" or "project"
    quota: Quota
    held: float = 0.0
    host_held: tuple[float, float] = (0.0, 0.0)

    def limits_only(self) -> QuotaSide:
        """The same limits with nothing used or held (could it ever run?)."""
        return QuotaSide(self.scope, replace(self.quota, gpu_hours_used=0.0))


def over(limit: float | None, amount: float) -> bool:
    """The one comparison of every quota check: ``amount`` is past ``limit`` (None: no limit)."""
    return limit is not None and amount > limit + _EPS


def position_refusal(
    sides: Iterable[QuotaSide],
    *,
    gpus: float,
    gpu_hours: float,
    host: tuple[float, float] | None = None,
) -> QuotaRefusal | None:
    """The one check of a quota position, for every path (the allocator's ledgers compare the
    same way): each side by ``quota_refusal``, the project's first, so a refusal names the
    project's limit whenever that one binds (as the allocator's reasons do, ``Quotas.of``).
    With ``host`` (the cores and memory MiB the request holds, summed over its nodes), the
    limits of cores and memory too: ``host_held`` plus the request's within ``max_cpus`` and
    ``max_memory_mib``."""
    ordered = sorted(sides, key=lambda side: side.scope != "project")
    for side in ordered:
        refusal = quota_refusal(side.quota, gpus=gpus, gpu_hours=gpu_hours, held=side.held)
        if refusal is not None:
            return replace(refusal, scope=side.scope)
    if host is None:
        return None
    for side in ordered:
        for index, (limit, _) in enumerate(HOST_LIMITS):
            value = getattr(side.quota, limit)
            if over(value, side.host_held[index] + host[index]):
                return QuotaRefusal(limit, value, side.host_held[index], host[index], side.scope)
    return None


GPU_SECOND = 1 / 3600  # GPU-hours: the smallest further use the budget scan asks about


def budget_nearly_used(side: QuotaSide, fraction: float) -> bool:
    """Whether the budget scan warns: the GPU-hours used leave no room under ``fraction`` of the
    budget for one more GPU-second, by the one rule (``quota_refusal``)."""
    budget = side.quota.gpu_hours_budget
    if budget is None:
        return False
    scaled = Quota(gpu_hours_budget=fraction * budget, gpu_hours_used=side.quota.gpu_hours_used)
    return quota_refusal(scaled, gpus=0.0, gpu_hours=GPU_SECOND) is not None


def quota_refusal(
    quota: Quota, *, gpus: float, gpu_hours: float = 0.0, held: float = 0.0
) -> QuotaRefusal | None:
    """The one quota rule, for every caller (submission, reservation, extend, the allocator).

    ``held`` GPU-equivalents already held at the busiest moment plus ``gpus`` must stay within
    ``max_gpus``; GPU-hours used in the period plus ``gpu_hours`` within the budget. The
    concurrency limit is checked first.
    """
    if over(quota.max_gpus, held + gpus):
        return QuotaRefusal("max_gpus", quota.max_gpus, held, gpus)
    budget = quota.gpu_hours_budget
    if over(budget, quota.gpu_hours_used + gpu_hours):
        return QuotaRefusal("gpu_hours_budget", budget, quota.gpu_hours_used, gpu_hours)
    return None


class Ledger:
    """Use of one quota key (a user or a project) as (start, end, amount, booking) intervals."""

    def __init__(self, label: str, quota: Quota) -> None:
        self.label = label
        self.quota = quota
        self.intervals: list[tuple[float, float, float, str]] = []
        self.planned_hours = 0.0
        self._steps: tuple[list[float], list[float]] | None = None

    def add(self, start: float, end: float, amount: float, booking_id: str) -> None:
        """Count ``amount`` GPU-equivalents in use over [start, end)."""
        self.intervals.append((start, end, amount, booking_id))
        if self._steps is None:
            return
        times, levels = self._steps
        first, last = _breakpoint(times, levels, start), _breakpoint(times, levels, end)
        for i in range(first, last):
            levels[i] += amount

    def amount_in(self, amount):
        """What this ledger counts of a booking's ``amount`` (GPU-equivalents: all of it)."""
        return amount

    def remove(self, booking_id: str) -> None:
        """Forget a booking's use (it is being preempted)."""
        self.intervals = [iv for iv in self.intervals if iv[3] != booking_id]
        self._steps = None

    def steps(self) -> tuple[list[float], list[float]]:
        """Use as a step function: ``levels[i]`` holds over [times[i], times[i+1])."""
        if self._steps is None:
            deltas: dict[float, float] = {}
            for start, end, amount, _ in self.intervals:
                deltas[start] = deltas.get(start, 0.0) + amount
                deltas[end] = deltas.get(end, 0.0) - amount
            times, levels, level = [], [], 0.0
            for t in sorted(deltas):
                level += deltas[t]
                times.append(t)
                levels.append(level)
            self._steps = (times, levels)
        return self._steps

    def peak(self, start: float, end: float) -> float:
        """Highest concurrent use at any instant of [start, end)."""
        times, levels = self.steps()
        i = bisect_right(times, start) - 1
        top = levels[i] if i >= 0 else 0.0
        for j in range(i + 1, len(times)):
            if times[j] >= end:
                break
            top = max(top, levels[j])
        return top

    def earliest(self, amount: float, duration: float, not_before: float) -> float | None:
        """Earliest t >= not_before at which ``amount`` more fits over [t, t+duration).

        One forward walk over the steps: a step whose level leaves no room for ``amount`` and
        overlaps the window pushes the window's start to that step's end. Linear in the steps
        after ``not_before``.
        """
        limit = self.quota.max_gpus
        if limit is None:
            return not_before
        if over(limit, amount):
            return None
        times, levels = self.steps()
        n, t = len(times), not_before
        # over(limit, level + amount), without a call per step (a third of the pass's quota time)
        bound = limit + _EPS
        j = max(0, bisect_right(times, t) - 1)
        while j < n and times[j] < t + duration:
            if levels[j] + amount > bound and (j + 1 == n or times[j + 1] > t):
                if j + 1 == n:
                    return None
                t = times[j + 1]
            j += 1
        return t

    def budget_left(self) -> float | None:
        """GPU-hours left in the budget after use so far and this pass's plans (None: no budget)."""
        budget = self.quota.gpu_hours_budget
        if budget is None:
            return None
        return budget - self.quota.gpu_hours_used - self.planned_hours

    def describe_now(self, now: float, amount: float) -> str:
        """A sentence saying how much of the concurrency limit is in use now."""
        used = self.peak(now, now + _EPS)
        return (
            f"{self.label} quota: {_gpus(used)} of {_gpus(self.quota.max_gpus)} GPUs in use, "
            f"needs {_gpus(amount)}"
        )


def _gpus(value: float) -> str:
    # MIG slices make sevenths: 8.43, not 8.42857.
    return f"{round(value, 2):g}"


class ArrayLedger(Ledger):
    """The running limit of one job array, as a concurrency limit of ``limit`` tasks of
    ``task_size`` GPU-equivalents each (the tasks of an array have one shape)."""

    def __init__(self, array: str, limit: int, task_size: float) -> None:
        super().__init__(f"array {array}", Quota(max_gpus=limit * task_size))
        self.limit, self.task_size = limit, task_size

    def describe_now(self, now: float, amount: float) -> str:
        """A sentence saying how many of the array's tasks hold devices now."""
        tasks = round(self.peak(now, now + _EPS) / self.task_size) if self.task_size else 0
        return f"{self.label}: {tasks} of at most {self.limit} tasks running"


class HostLedger(Ledger):
    """Concurrent use of cores (``limit`` "max_cpus") or host memory ("max_memory_mib") by one
    user or project: what its bookings hold on their nodes (``resources.node_demand``), borrowed
    ones too (these limits are never borrowed past). ``index``: the demand's (cores, memory)
    element it counts."""

    def __init__(self, label: str, limit: str, value: float) -> None:
        super().__init__(label, Quota(max_gpus=value))
        self.limit = limit
        self.index = 0 if limit == "max_cpus" else 1
        self.unit = dict(HOST_LIMITS)[limit]

    def amount_in(self, demand: tuple[int, int]) -> int:
        """Its element of a (cores, memory) demand."""
        return demand[self.index]

    def describe_now(self, now: float, amount: float) -> str:
        """A sentence saying how much of the limit is in use now."""
        used = self.peak(now, now + _EPS)
        return (
            f"{self.label} quota: {used:g} of {self.quota.max_gpus:g} {self.unit} in use, "
            f"needs {amount:g}"
        )


class Quotas:
    """All ledgers of one pass, keyed ("user", name), ("project", name) and ("array", name);
    the limits of cores and memory ("user max_cpus", name), ("project max_memory_mib", name)..."""

    def __init__(
        self,
        users: Mapping[str, Quota],
        projects: Mapping[str, Quota],
        arrays: Mapping[str, ArrayLedger] | None = None,
    ) -> None:
        self.ledgers: dict[tuple[str, str], Ledger] = {}
        for kind, table in (("user", users), ("project", projects)):
            for name, quota in table.items():
                self.ledgers[(kind, name)] = Ledger(f"{kind} {name}", quota)
                for key, value in host_ledgers(kind, name, quota):
                    self.ledgers[key] = value
        for name, ledger in (arrays or {}).items():
            self.ledgers[("array", name)] = ledger
        self.hosted = any(isinstance(ledger, HostLedger) for ledger in self.ledgers.values())

    def host_of(self, user: str, project: str) -> list[HostLedger]:
        """The ledgers of cores and memory limits that apply to a booking (the project's
        first, as ``of``)."""
        if not self.hosted:
            return []
        keys = [
            (f"{kind} {limit}", name)
            for kind, name in (("project", project), ("user", user))
            for limit, _ in HOST_LIMITS
        ]
        return [self.ledgers[key] for key in keys if key in self.ledgers]

    def add_host(self, ledgers, span: tuple[float, float], demand, bid: str) -> None:
        """Count ``demand`` (cores, memory: all a booking holds, summed over its nodes) over
        ``span`` against ``ledgers`` (``host_of``)."""
        for ledger in ledgers:
            if ledger.amount_in(demand):
                ledger.add(span[0], span[1], ledger.amount_in(demand), bid)

    def host_blocking(self, ledgers, demand, now: float, duration: float) -> str | None:
        """A sentence naming the cores or memory limit that stops a start at ``now`` (or that
        is below the demand itself), else None."""
        for ledger in ledgers:
            amount = ledger.amount_in(demand)
            if over(ledger.quota.max_gpus, amount):
                return (
                    f"{ledger.label} quota: limit {ledger.quota.max_gpus:g} {ledger.unit}, "
                    f"asks {amount:g}"
                )
            if ledger.earliest(amount, duration, now) != now:
                return ledger.describe_now(now, amount)
        return None

    def of(self, user: str, project: str, array: str = "") -> list[Ledger]:
        """The ledgers that apply to a booking of ``user`` in ``project`` (and ``array``).

        The project's first: the sentences below name the first ledger that holds a booking
        back, and a project limit that binds is the one to name even where the user's binds too
        (a user without a limit of their own has the project's: raising "theirs" would not help).
        """
        keys = (("project", project), ("user", user), ("array", array))
        return [self.ledgers[key] for key in keys if key in self.ledgers]

    def add(
        self,
        user: str,
        project: str,
        span: tuple[float, float],
        amount: float,
        bid: str,
        array: str = "",
        borrowed: bool = False,
    ):
        """Count a booking's use over ``span`` against its user, project and array. A borrowed
        booking counts against its array only: it is past its concurrency limits already
        (scheduler/borrowing.py keeps its own count)."""
        for ledger in self.of(user, project, array):
            if not borrowed or isinstance(ledger, ArrayLedger):
                ledger.add(span[0], span[1], amount, bid)

    def earliest(self, ledgers: list[Ledger], amount, duration: float, t: float):
        """Earliest t' >= t allowed by every ledger (None: a limit is below ``amount``): GPU
        ledgers take ``amount`` GPU-equivalents, the cores and memory ledgers (``host_of``)
        a (cores, memory) demand, each its own element of it (``Ledger.amount_in``)."""
        while True:
            latest = t
            for ledger in ledgers:
                found = ledger.earliest(ledger.amount_in(amount), duration, t)
                if found is None:
                    return None
                latest = max(latest, found)
            if latest == t:
                return t
            t = latest

    def below(self, ledgers: list[Ledger], amount: float) -> str | None:
        """A sentence naming a concurrency limit lower than ``amount`` itself, else None."""
        for ledger in ledgers:
            limit = ledger.quota.max_gpus
            if quota_refusal(Quota(max_gpus=limit), gpus=amount):
                return f"{ledger.label} quota: limit {_gpus(limit)} GPUs, asks {_gpus(amount)}"
        return None

    def over_budget(self, ledgers: list[Ledger], gpu_hours: float) -> str | None:
        """A sentence naming the first GPU-hour budget this booking would overrun, else None."""
        for ledger in ledgers:
            left = ledger.budget_left()
            budget = ledger.quota.gpu_hours_budget
            if left is not None and over(budget, budget - left + gpu_hours):
                spent = budget - left
                return (
                    f"{ledger.label} GPU-hour budget: {spent:g} of {budget:g} used or planned,"
                    f" needs {gpu_hours:g}"
                )
        return None

    def blocking_now(self, ledgers: list[Ledger], amount: float, now: float, duration: float):
        """A sentence naming the concurrency limit that stops a start at ``now``, else None."""
        for ledger in ledgers:
            if ledger.earliest(amount, duration, now) != now:
                return ledger.describe_now(now, amount)
        return None


def host_ledgers(kind: str, name: str, quota: Quota) -> list[tuple[tuple[str, str], HostLedger]]:
    """The cores and memory ledgers ``quota`` sets for a user or project, with their keys."""
    found = []
    for limit, _ in HOST_LIMITS:
        value = getattr(quota, limit)
        if value is not None:
            found.append(((f"{kind} {limit}", name), HostLedger(f"{kind} {name}", limit, value)))
    return found


def _breakpoint(times: list[float], levels: list[float], t: float) -> int:
    """Index of the step starting at ``t``, inserted (with the level before it) if missing."""
    i = bisect_right(times, t) - 1
    if i >= 0 and times[i] == t:
        return i
    times.insert(i + 1, t)
    levels.insert(i + 1, levels[i] if i >= 0 else 0.0)
    return i + 1
