"""Elastic quotas: borrowing past a concurrency limit, and reclaim (docs/scheduling.md).

A quota's ``max_gpus`` is its guaranteed share. With ``Quota.borrowing`` on, a booking held back
only by such limits starts *borrowed* once the walk has planned every booking: on devices free
over its whole window after every start and reservation of the walk, so no booking within its
limits loses a start or a reservation to it. The over-quota projects take turns by fair share
(the least borrowed GPU-equivalents per fair-share share first), each within
``Quota.max_borrow_gpus``; GPU-hour budgets and array limits are never borrowed past. A borrowed
booking counts against no concurrency limit and is always preemptible.

Reclaim runs before the walk: a booking within its limits that has waited
``Policy.reclaim_grace_s - Policy.reclaim_warning_s``, cannot start now nor before its grace
ends, and fits now once borrowed bookings on one node stop, stops them (the fewest GPU-hours
lost first, lost = GPU-equivalents x time run) and starts now on their devices (a preemption
starts a pass later); the stopped ones get the warning, so it has its devices within its
grace. Until then the borrowed
work runs on: many such bookings start on devices that free up meanwhile, and a borrowed
booking reclaimed and started again is not stopped at every arrival.
"""

from __future__ import annotations

import heapq
from collections import deque
from dataclasses import replace
from itertools import combinations

from scheduler.placement import Fit, is_multi_node, searches
from scheduler.preemption import (
    PreemptLater,
    freed_bits,
    freed_by,
    release_victim,
    room_after,
    room_on,
)
from scheduler.quota import ArrayLedger, Ledger
from scheduler.resources import total_demand
from scheduler.types import (
    REASON_QUOTA,
    REASON_RESOURCES,
    REASON_STARTING,
    Allocation,
    Planned,
    Preemption,
    Quota,
    Request,
)

_EXACT_UP_TO = 10  # victims per node searched exactly over subsets; greedy beyond


_BACKOFF_DOUBLINGS = 4


def borrow_backoff(policy, requeued_at: float, restarts: int) -> float:
    """When a booking requeued at ``requeued_at`` after ``restarts`` runs may borrow again
    (``Request.borrow_after``): the reclaim grace (at least a minute), doubled with each
    restart. Without it a long borrowed job is reclaimed, borrows again at once, and is
    reclaimed again by the next booking within its limits that waited its grace, losing its
    work each time (the replay measured tens of thousands of reclaims on one trace)."""
    if restarts <= 0:
        return 0.0
    base = max(policy.reclaim_grace_s, 60.0)
    return requeued_at + base * 2 ** min(restarts - 1, _BACKOFF_DOUBLINGS)


def reclaim_reason(project: str) -> str:
    """The reason a reclaimed booking's stop gives."""
    return f"reclaimed for project {project}'s quota"


def borrowing_on(state) -> bool:
    """Whether any quota of the pass lets its bookings borrow."""
    quotas = (*state.user_quotas.values(), *state.project_quotas.values())
    return any(quota.borrowing for quota in quotas)


# -- reclaim -------------------------------------------------------------------------------------


def reclaim_phase(
    run, ranked, preempting: dict[str, Fit], stopped: list[Preemption]
) -> list[Preemption]:
    """Stop borrowed bookings for bookings within their limits that would otherwise wait past
    the reclaim grace; hold the freed devices for them from now (added to ``preempting``).

    Walks ``ranked`` (eligible bookings in priority order) after the preemption phase. A
    booking of several nodes does not reclaim (it waits for the borrowed ones to end).
    ``stopped``: the preemption phase's, whose devices are free already."""
    by_node = _borrowed_by_node(run, {p.booking_id for p in stopped})
    if not by_node:
        return []
    policy = run.policy
    grace = policy.reclaim_grace_s
    slack = grace - policy.reclaim_warning_s
    preemptions: list[Preemption] = []
    for request, _ in ranked:
        if request.booking_id in preempting or not _within_limits_now(run, request):
            continue
        if is_multi_node(request, run.nodes):
            continue
        start = _earliest_start(run, request)
        if start is not None and start <= max(run.now, request.submit_time + grace):
            continue  # it starts now, or within its grace without a reclaim
        choice = _least_lost(run, request, by_node)
        if choice is None:
            continue
        part, victims = choice
        if run.host_start(request, Fit(run.now, (part,))) != run.now:
            continue  # its limits of cores or memory would not let it start there
        at = request.submit_time + slack
        if run.now < at:  # not yet: its line says whom it will stop, and when
            ids = tuple(victim.booking_id for victim in victims)
            run.preempt_later.setdefault(request.booking_id, PreemptLater(ids, at))
            continue
        for victim in victims:
            release_victim(run, victim, by_node)
            reason = reclaim_reason(request.project)
            preemptions.append(Preemption(victim.booking_id, request.booking_id, reason))
        ids = ", ".join(victim.booking_id for victim in victims)
        plural = "s" if len(victims) > 1 else ""
        run.reclaiming[request.booking_id] = (
            f"reclaiming borrowed devices from booking{plural} {ids}"
        )
        preempting[request.booking_id] = Fit(run.now, (part,))
        run.reserve(request, preempting[request.booking_id])
        if not by_node:
            break
    return preemptions


def _borrowed_by_node(run, stopped: set[str]) -> dict[int, list[Allocation]]:
    """Running borrowed allocations not stopped already on up nodes, listed under every node
    they touch."""
    by_node: dict[int, list[Allocation]] = {}
    for alloc in run.state.allocations:
        if alloc.booking_id in stopped or not alloc.borrowed:
            continue
        if alloc.running and alloc.start <= run.now < alloc.end:
            for node in {run.where[d][0] for d in alloc.device_ids if d in run.where}:
                if node.up:
                    by_node.setdefault(node.index, []).append(alloc)
    return by_node


def _within_limits_now(run, request: Request) -> bool:
    """Its concurrency limits, budgets and array limit all let it start now."""
    ledgers = run.quotas.of(request.user, request.project, request.array)
    amount, duration = run.size(request), request.duration_s
    if run.quotas.over_budget(ledgers, amount * duration / 3600.0):
        return False
    return not ledgers or run.quotas.earliest(ledgers, amount, duration, run.now) == run.now


def _earliest_start(run, request: Request) -> float | None:
    """Earliest start on one node of the devices as they stand (running allocations, advance
    reservations, the preemption phase's holds): a lower bound of the walk's start."""
    best = None
    for choice in searches(request, run.finder.site, False):
        for node in run.nodes:
            need = node.need(choice.mig_profile, choice.device_match)
            if need.bit_count() < choice.gpus:
                continue
            demand = node.demand_of(choice)
            found = node.timeline.earliest(need, choice.gpus, choice.duration_s, run.now, demand)
            if found is not None and (best is None or found[0] < best):
                best = found[0]
    return best


def _least_lost(run, request: Request, by_node: dict[int, list[Allocation]]):
    """((node index, mask), victims): the borrowed bookings on one node whose stop lets the
    request start now with the fewest GPU-hours lost, then the fewest victims; or None."""
    now, end = run.now, run.now + request.duration_s
    best = None
    for choice in searches(request, run.finder.site, False):
        for index in sorted(by_node):
            node = run.nodes[index]
            match = (choice.mig_profile, choice.device_match)
            room = room_on(run, index, request, *match, end, gpus=choice.gpus)
            if room is None:
                continue
            need, free = room
            options = []
            for alloc in by_node[index]:
                bits = freed_bits(run, node, alloc, need, end)
                if bits:
                    lost = run.held(alloc) * (now - alloc.start) / 3600.0
                    options.append((lost, bits, alloc.booking_id))
            combo = cheapest_victims(options, choice.gpus - free.bit_count())
            if node.capacity is not None:  # their cores and memory must make room too
                combo = room_after(run, node, choice, combo, options, by_node[index], end)
            if not combo:
                continue
            key = (sum(victim[0] for victim in combo), len(combo), index)
            if best is None or key < best[0]:
                freed, chosen = freed_by(free, combo, by_node[index])
                best = (key, (index, node.choose(freed, choice.gpus)), chosen)
    return None if best is None else best[1:]


def cheapest_victims(options: list[tuple[float, int, str]], missing: int) -> tuple | None:
    """Victims (GPU-hours lost, bitmask, id) freeing ``missing`` devices with the fewest
    GPU-hours lost, then the fewest victims (exact up to 10 options, greedy beyond); None when
    all of them free too few. Empty when nothing is missing."""
    if missing <= 0:
        return ()
    if len(options) > _EXACT_UP_TO:
        picked, freed = [], 0
        for option in sorted(options, key=lambda o: (o[0] / o[1].bit_count(), o[2])):
            picked.append(option)
            freed |= option[1]
            if freed.bit_count() >= missing:
                return tuple(picked)
        return None
    best = None
    for size in range(1, len(options) + 1):
        for combo in combinations(options, size):
            freed = 0
            for option in combo:
                freed |= option[1]
            if freed.bit_count() < missing:
                continue
            key = (sum(option[0] for option in combo), size, [option[2] for option in combo])
            if best is None or key < best[0]:
                best = (key, combo)
    return None if best is None else best[1]


# -- borrowing -----------------------------------------------------------------------------------


class BorrowedUse:
    """Borrowed GPU-equivalents per quota key with borrowing on (bounded by max_borrow_gpus),
    and held now per project (the fair share of borrowed capacity)."""

    def __init__(self, run) -> None:
        self.run = run
        self.ledgers: dict[tuple[str, str], Ledger] = {}
        for kind, table in (("user", run.state.user_quotas), ("project", run.state.project_quotas)):
            for name, quota in table.items():
                if quota.borrowing:
                    limit = Quota(max_gpus=quota.max_borrow_gpus)
                    self.ledgers[(kind, name)] = Ledger(f"{kind} {name} borrowing", limit)
        self.now_by_project: dict[str, float] = {}
        for alloc in run.state.allocations:
            if alloc.borrowed and alloc.end > run.now:
                self.add(
                    alloc.user,
                    alloc.project,
                    alloc.start,
                    alloc.end,
                    run.held(alloc),
                    alloc.booking_id,
                )

    def add(self, user: str, project: str, start: float, end: float, amount: float, bid: str):
        """Count a borrowed booking over [start, end)."""
        now = self.run.now
        for key in (("user", user), ("project", project)):
            if key in self.ledgers:
                self.ledgers[key].add(max(start, now), end, amount, bid)
        if start <= now:
            self.now_by_project[project] = self.now_by_project.get(project, 0.0) + amount

    def turn(self, project: str) -> float:
        """The fair-share key: borrowed now per share (lowest borrows next)."""
        share = self.run.state.project_shares.get(project, 1.0)
        return self.now_by_project.get(project, 0.0) / max(share, 1e-9)

    def room(self, kind: str, name: str, amount: float, duration: float) -> bool:
        """Whether ``amount`` more borrowed GPU-equivalents fit that key's max_borrow_gpus
        (a key that does not lend bounds nothing)."""
        ledger = self.ledgers.get((kind, name))
        now = self.run.now
        return ledger is None or ledger.earliest(amount, duration, now) == now


def borrow_phase(run, walk, planned: list[Planned], only: str | None = None) -> None:
    """Start borrowed the bookings the walk held back by a concurrency limit with borrowing on,
    on devices free now over their whole window; project by project by fair share, each
    project's bookings in priority order. Rewrites their lines and appends their starts.

    ``only`` (the estimate's ``until``): that booking alone may borrow, on what the walk up to
    it leaves free. Where the whole pass starts it borrowed, so does this; it may say it starts
    where other borrowers would take the devices first."""
    if not borrowing_on(run.state) or not run.free_now():
        return
    requests = {request.booking_id: request for request in run.state.pending}
    # Without explanations (the replay) a booking held back by its quota reads "resources".
    held_back = {REASON_QUOTA} if run.policy.explain else {REASON_QUOTA, REASON_RESOURCES}
    queues: dict[str, deque[int]] = {}
    for i, line in enumerate(planned):
        if line.reason in held_back and only in (None, line.booking_id):
            queues.setdefault(requests[line.booking_id].project, deque()).append(i)
    if not queues:
        return
    use = BorrowedUse(run)
    keys = {id(ledger): key for key, ledger in run.quotas.ledgers.items()}
    turns = [(use.turn(project), queue[0], project) for project, queue in queues.items()]
    heapq.heapify(turns)
    failed: dict[tuple, dict[int, float]] = {}
    while turns and run.free_now():
        _, _, project = heapq.heappop(turns)
        queue = queues[project]
        i = queue.popleft()
        request = requests[planned[i].booking_id]
        past = _limits_past(run, use, keys, request, planned[i])
        if past:
            line = _start_borrowed(run, walk, use, request, planned[i], past, failed)
            if line is not None:
                planned[i] = line
        if queue:
            heapq.heappush(turns, (use.turn(project), queue[0], project))


def _limits_past(run, use: BorrowedUse, keys: dict, request: Request, line: Planned):
    """The labels of the concurrency limits the request would borrow past now, or () where it
    may not borrow: a budget, an array limit or a limit without borrowing holds it back, or a
    ``max_borrow_gpus`` has no room."""
    if run.now < request.borrow_after:
        return ()  # reclaimed lately: it backs off before it borrows again
    ledgers = run.quotas.of(request.user, request.project, request.array)
    amount, duration = run.size(request), request.duration_s
    hours = amount * duration / 3600.0
    if line.device_ids:  # the walk reserved it for later: that use is its own, not another's
        for ledger in ledgers:
            ledger.remove(request.booking_id)
            ledger.planned_hours -= hours
    if run.quotas.over_budget(ledgers, hours):
        return ()
    past = []
    for ledger in ledgers:
        kind, name = keys[id(ledger)]
        if not use.room(kind, name, amount, duration):
            return ()  # every max_borrow_gpus of its user and project bounds what it borrows
        if ledger.earliest(amount, duration, run.now) == run.now:
            continue
        if isinstance(ledger, ArrayLedger) or not ledger.quota.borrowing:
            return ()
        past.append(ledger.label)
    return tuple(past)


def _start_borrowed(run, walk, use, request: Request, line: Planned, past, failed: dict):
    """Start it borrowed if its devices are free now over its window: its new line, or None."""
    multi = is_multi_node(request, run.nodes)
    shape = failed.setdefault((request.mig_profile, request.device_match, multi), {})
    if any(g <= request.gpus and d <= request.duration_s for g, d in shape.items()):
        return None  # free devices only shrink: no wider and longer one fits either
    fit = run.finder.find(request, multi, run.now)
    if fit is None or fit.start != run.now:
        shape[request.gpus] = min(shape.get(request.gpus, float("inf")), request.duration_s)
        return None
    if run.host_start(request, fit) != run.now:
        return None  # limits of cores and memory are never borrowed past
    end = run.now + request.duration_s
    amount = run.size(request)
    for index, mask in fit.parts:
        node = run.nodes[index]
        if request.fractional:  # its share of the shared GPU, as the walk's starts hold it
            amount = run.hold_share(request, node, mask, run.now, end)
        else:
            node.timeline.occupy(mask, run.now, end)
            node.timeline.hold(*node.demand_of(request), run.now, end)
    if run.project_holds:
        run.project_holds.occupy(fit.parts, run.now, end, run.demands(request, fit))
    for ledger in run.quotas.of(request.user, request.project, request.array):
        ledger.planned_hours += amount * request.duration_s / 3600.0
        if isinstance(ledger, ArrayLedger):
            ledger.add(run.now, end, amount, request.booking_id)
    use.add(request.user, request.project, run.now, end, amount, request.booking_id)
    hosts = run.quotas.host_of(request.user, request.project)
    if hosts:
        held = total_demand(run.demands(request, fit))
        run.quotas.add_host(hosts, (run.now, end), held, request.booking_id)
    ids = run.device_ids(fit)
    walk.starts.append(replace(run.start_of(request, fit), borrowed_past=past))
    detail = f"starts now, borrowed past the {' and '.join(past)} quota"
    return Planned(
        request.booking_id, run.now, ids, line.position, REASON_STARTING, detail, line.priority
    )
