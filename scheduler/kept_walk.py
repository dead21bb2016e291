"""The pass's walk kept between estimates: where would one more request go in this queue?

Under conservative backfill a booking's line depends only on the bookings ranked above it, so
the line of a request not yet queued, at rank r, is the state after the first r - 1 bookings of
the walk (timelines, quota ledgers, reservations counted) plus one search. ``keep_walk`` walks
the queue once and keeps a copy of that state every ``every`` positions; ``KeptWalk.line``
finds the request's rank by its priority, resumes from the nearest copy before it, walks the
few bookings between, and places the request: the same line as ``plan()`` of the queue with the
request in it, at a cost of at most ``every`` bookings instead of the whole queue.

It answers None where the request would change the walk before its own place (it would become
the top QOS, protected ahead of an older booking, a preemptor, a dependant or an array task, a
new project that moves the fair shares, or a quota that differs from the queue's for its user or
project): the caller plans it with ``plan(until=...)`` then.

The walk is the allocator's own (``_Pass`` and ``_Walk``): the kept copy must be exactly the
state ``plan()`` reaches, so it is built by the same code, not by a second copy of it.
"""

from __future__ import annotations

import copy
import math
from bisect import bisect_left
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from scheduler.allocator import _copy, _Pass, _Walk
from scheduler.borrowing import borrowing_on, reclaim_phase
from scheduler.placement import Finder, Node
from scheduler.preemption import preempt_phase
from scheduler.priority import fairshare_factors, priority_of
from scheduler.quota import Ledger, Quotas, host_ledgers
from scheduler.timeline import NodeTimeline
from scheduler.types import Planned, Policy, Quota, Request, State


@dataclass(frozen=True)
class _Saved:
    """The walk's working state after its first ``done`` bookings."""

    done: int
    timelines: tuple
    ledgers: dict
    reserved: int
    last_start: float
    failed: dict
    bounds: tuple


def keep_walk(
    state: State, policy: Policy, every: int = 128, pause: Callable[[], object] | None = None
) -> KeptWalk:
    """Walk the queue of ``state`` once, keeping its working state every ``every`` positions.

    ``pause`` is called every ``PAUSE_EVERY`` bookings of the walk: a caller that walks in the
    background may wait there while its requests run."""
    return KeptWalk(state, policy, every, pause)


PAUSE_EVERY = 16


class KeptWalk:
    """One queue walked in priority order, with copies of its state to resume estimates from."""

    def __init__(
        self, state: State, policy: Policy, every: int, pause: Callable[[], object] | None = None
    ) -> None:
        self.state, self.policy, self.every = state, policy, every
        run = self.run = _Pass(state, policy)
        self.ranked = run.ordered()
        eligible = [pair for pair in self.ranked if pair[0].booking_id not in run.waiting]
        preemptions, preempting = preempt_phase(run, eligible)
        preemptions += reclaim_phase(run, eligible, preempting, preemptions)
        self.preempted = [p.booking_id for p in preemptions]
        walk = self.walk = _Walk(run, preempting)
        self.saved: list[_Saved] = []
        for done in range(len(self.ranked) + 1):
            if done % every == 0:
                self.saved.append(_save(done, run, walk, self.saved[-1] if self.saved else None))
            if done < len(self.ranked):
                run.step(walk, self.ranked, done)  # may move a booking up (protection handed on)
            if pause is not None and done % PAUSE_EVERY == 0:
                pause()
        # The order as walked: a booking protection was handed to stands with the protected
        # ones. A request's rank is found among the keys while they are sorted; past the first
        # key out of order it is not answered.
        self.keys = [run._rank(pair) for pair in self.ranked]
        self.sorted_upto = next(
            (i for i in range(1, len(self.keys)) if self.keys[i] < self.keys[i - 1]),
            len(self.keys),
        )
        projects = {request.project for request in state.pending}
        self.fair = fairshare_factors(projects, state.project_shares, state.project_usage)
        self.users = {request.user for request in state.pending}
        self.projects = projects
        top = [r for r in state.pending if policy.qos_level(r.qos) == run.top_qos]
        self.oldest = sorted((r.submit_time, r.booking_id) for r in top)[: policy.protect_oldest]
        running = [a for a in state.allocations if a.running and a.preemptible]
        self.lowest_preemptible = min((policy.qos_level(a.qos) for a in running), default=math.inf)

    def line(
        self,
        request: Request,
        *,
        user_quotas: Mapping[str, Quota] | None = None,
        project_quotas: Mapping[str, Quota] | None = None,
        project_shares: Mapping[str, float] | None = None,
    ) -> Planned | None:
        """``request``'s line in ``plan()`` of the queue with it (and these quotas and shares
        merged in), or None where it would change the walk before its place."""
        state, run = self.state, self.run
        users = {**state.user_quotas, **(user_quotas or {})}
        projects = {**state.project_quotas, **(project_quotas or {})}
        shares = {**state.project_shares, **(project_shares or {})}
        if not self._unchanged_before(request, users, projects, shares):
            return None
        for kind, table, name in (
            ("user", users, request.user),
            ("project", projects, request.project),
        ):
            quota = table.get(name)
            for key, _ in host_ledgers(kind, name, quota) if quota is not None else ():
                if key not in run.quotas.ledgers:
                    return None  # limits of cores or memory the queue has not: plan it whole
        twin = self._resume_pass(request)
        fair = fairshare_factors(self.projects | {request.project}, shares, state.project_usage)
        prio = priority_of(
            request, run.now, run.size(request), fair[request.project], self.policy, run.scales
        )
        rank = bisect_left(self.keys, twin._rank((request, prio)), 0, self.sorted_upto)
        if rank == self.sorted_upto < len(self.keys):
            return None
        saved = self.saved[rank // self.every]
        walk = _resume(saved, twin, self.walk)
        for done in range(saved.done, rank):
            walk.place(done + 1, *self.ranked[done])
        for kind, table, name in (
            ("user", users, request.user),
            ("project", projects, request.project),
        ):
            if (kind, name) not in twin.quotas.ledgers and name in table:
                twin.quotas.ledgers[(kind, name)] = self._new_ledger(kind, name, table[name])
        return walk.place(rank + 1, request, prio)

    def _unchanged_before(self, request: Request, users, projects, shares) -> bool:
        """Whether the bookings ranked above ``request`` walk as in the kept walk."""
        state, run, policy = self.state, self.run, self.policy
        if not state.pending or request.after or request.array:
            return False
        if run.project_holds:
            return False  # the holds' views are not kept: plan it with the whole walk
        if borrowing_on(state) or any(a.borrowed for a in state.allocations):
            return False  # it could borrow after the walk, or reclaim before it
        if run.now - request.submit_time >= policy.preempt_grace_s:
            return False  # it could preempt, before the walk
        if policy.qos_level(request.qos) > self.lowest_preemptible:
            return False  # it could preempt once its grace is over: its line says when
        level = policy.qos_level(request.qos)
        if level > run.top_qos:
            return False  # protection would move to its QOS
        mine = (request.submit_time, request.booking_id)
        if level == run.top_qos and any(key is None or key > mine for key in run.handed):
            return False  # the walk would hand protection to it, not to the one it did
        full = len(self.oldest) >= policy.protect_oldest
        if level == run.top_qos and full and self.oldest:
            if (request.submit_time, request.booking_id) < self.oldest[-1]:
                return False  # it would push an older booking out of the protected few
        for table, old, name, known in (
            (users, state.user_quotas, request.user, self.users),
            (projects, state.project_quotas, request.project, self.projects),
        ):
            if name in old and table[name] != old[name]:
                return False
            if name not in old and name in table and name in known:
                return False  # queued bookings of that key would get a ledger
        fair = fairshare_factors(self.projects | {request.project}, shares, state.project_usage)
        return all(fair[name] == factor for name, factor in self.fair.items())

    def _resume_pass(self, request: Request) -> _Pass:
        """A shallow twin of the kept pass that may hold ``request`` among its oldest."""
        twin = copy.copy(self.run)
        twin._free_now = {}  # pruned by the kept walk's own, later, timelines
        top = self.policy.qos_level(request.qos) == twin.top_qos
        if top and len(self.oldest) < self.policy.protect_oldest:
            twin.oldest = twin.oldest | {request.booking_id}
        return twin

    def _new_ledger(self, kind: str, name: str, quota: Quota) -> Ledger:
        """The ledger ``plan()`` would build for a key the queue has no quota for: the live
        allocations' use (no queued booking has that key)."""
        run = self.run
        ledger = Ledger(f"{kind} {name}", quota)
        for alloc in run.state.allocations:
            mine = (alloc.user if kind == "user" else alloc.project) == name
            if alloc.end > run.now and mine and not alloc.borrowed:
                held = (max(alloc.start, run.now), alloc.end)
                ledger.add(*held, run.held(alloc), alloc.booking_id)
        for booking_id in self.preempted:
            if any(iv[3] == booking_id for iv in ledger.intervals):
                ledger.remove(booking_id)
        return ledger


def _save(done: int, run: _Pass, walk: _Walk, last: _Saved | None) -> _Saved:
    """A copy of the walk's state; what did not change since ``last`` is shared with it (the
    saved copies are never changed: a resumed walk works on copies of them)."""
    timelines = []
    for i, node in enumerate(run.nodes):
        timeline = last.timelines[i] if last is not None else None
        if timeline is None or timeline.version != node.timeline.version:
            timeline = _copy(node.timeline)
            timeline.version = node.timeline.version
        timelines.append(timeline)
    ledgers = {}
    for key, ledger in run.quotas.ledgers.items():
        twin = last.ledgers.get(key) if last is not None else None
        if twin is None or _ledger_mark(twin) != _ledger_mark(ledger):
            twin = _ledger_copy(ledger)
        ledgers[key] = twin
    failed = {key: dict(value) for key, value in walk.failed.items()}
    saved = (tuple(timelines), ledgers, walk.reserved, walk.last_start, failed)
    return _Saved(done, *saved, run.finder.bounds())


def _ledger_mark(ledger: Ledger) -> tuple:
    # The walk only adds to ledgers (removals happen in the preemption phase, before it).
    return len(ledger.intervals), ledger.planned_hours


def _ledger_copy(ledger: Ledger) -> Ledger:
    twin = object.__new__(type(ledger))
    twin.__dict__.update(ledger.__dict__)
    twin.intervals = list(ledger.intervals)
    steps = ledger._steps
    twin._steps = None if steps is None else (list(steps[0]), list(steps[1]))
    return twin


class _Borrowed(NodeTimeline):
    """A saved timeline read as is and copied the first time it changes (most never do)."""

    __slots__ = ("owned",)

    def __init__(self, saved: NodeTimeline) -> None:
        self.times, self.masks, self.owned = saved.times, saved.masks, False
        self.shares, self.res = saved.shares, saved.res
        self.version = saved.version  # the saved bounds name these versions

    def occupy(self, bits: int, start: float, end: float) -> None:
        """Mark devices ``bits`` busy over [start, end), on a copy of its own."""
        self._own()
        super().occupy(bits, start, end)

    def release(self, bits: int, start: float, end: float) -> None:
        """Mark devices ``bits`` free over [start, end), on a copy of its own."""
        self._own()
        super().release(bits, start, end)

    def hold(self, cpus: int, memory: int, start: float, end: float) -> None:
        """Hold cores and memory over [start, end), on a copy of its own."""
        if self.res is not None and (cpus or memory):
            self._own()
            super().hold(cpus, memory, start, end)

    def hold_share(self, bit: int, shares, compute: float, memory: int, start: float, end: float):
        """Hold part of a shared device, on a copy of its own (``shares`` is read, not kept)."""
        self._own()  # after it every share timeline in self.shares is this one's own
        twin = self.shares.get(bit)
        super().hold_share(
            bit, shares.copy() if twin is None else twin, compute, memory, start, end
        )

    def _own(self) -> None:
        if not self.owned:
            self.times, self.masks, self.owned = list(self.times), list(self.masks), True
            self.shares = {bit: shares.copy() for bit, shares in self.shares.items()}
            self.res = None if self.res is None else self.res.copy()


class _CopiedOnRead(dict):
    """Saved ledgers, each copied the first time the walk reads it (most are never read)."""

    def __init__(self, saved: dict) -> None:
        super().__init__(saved)
        self.copied: set = set()

    def __getitem__(self, key):
        if key not in self.copied:
            self.copied.add(key)
            self[key] = _ledger_copy(super().__getitem__(key))
        return super().__getitem__(key)


def _resume(saved: _Saved, twin: _Pass, kept: _Walk) -> _Walk:
    """Point ``twin`` (and a twin of the walk) at fresh copies of a saved state."""
    twin.nodes = []
    for node, timeline in zip(kept.run.nodes, saved.timelines, strict=True):
        copied = object.__new__(Node)
        copied.__dict__.update(node.__dict__)
        copied.timeline = _Borrowed(timeline)
        twin.nodes.append(copied)
    twin.finder = Finder(twin.nodes, twin.now)
    twin.finder.resume(saved.bounds)
    twin.quotas = Quotas({}, {})
    twin.quotas.ledgers = _CopiedOnRead(saved.ledgers)
    walk = copy.copy(kept)
    walk.run, walk.starts, walk.host_blocked = twin, [], {}
    walk.reserved, walk.last_start = saved.reserved, saved.last_start
    walk.failed = {key: dict(value) for key, value in saved.failed.items()}
    return walk
