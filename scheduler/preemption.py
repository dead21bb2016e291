"""Preemption: a booking of a higher QOS, pending past the grace period, may stop preemptible
running bookings of lower QOS (as few and as low as possible) to start now: on one node for a
request that fits on one, on whole nodes cleared entirely for a larger one."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

from scheduler import sharing
from scheduler.placement import (
    Fit,
    fewest_victims,
    fit_horizon,
    held_demands,
    is_multi_node,
    searches,
)
from scheduler.types import Allocation, Preemption, Request


@dataclass(frozen=True)
class PreemptLater:
    """A booking that will preempt once its grace period is over: the bookings it would stop,
    as they stand now, and when."""

    victims: tuple[str, ...]
    at: float

    @property
    def detail(self) -> str:
        """ "will preempt booking 12 at 2026-12-03 14:05 UTC" """
        moment = datetime.fromtimestamp(self.at, UTC)
        plural = "s" if len(self.victims) > 1 else ""
        return (
            f"will preempt booking{plural} {', '.join(self.victims)} at {moment:%Y-%m-%d %H:%M} UTC"
        )


def preempt_phase(run, ranked) -> tuple[list[Preemption], dict[str, Fit]]:
    """Pick victims for eligible bookings in priority order; hold their devices from now.

    A booking that would preempt but for its grace period is listed in ``run.preempt_later``
    with the victims it would pick now and the end of its grace, so its reason says so.
    Runs before the planning walk, so a preempting booking takes precedence over the queue.
    Free devices only shrink during the phase, so a shape that fits now, or finds no victims, is
    remembered, by shape and not by duration: how long a shape fits from now answers every
    duration, and a shape with no victims for one duration has none for any longer one.
    """
    policy = run.policy
    by_node = _preemptible_by_node(run)
    if not by_node:
        return [], {}
    lowest = min(policy.qos_level(a.qos) for allocs in by_node.values() for a in allocs)
    preemptions: list[Preemption] = []
    preempting: dict[str, Fit] = {}
    fits_now: dict[tuple, float | None] = {}
    # Per shape of devices, the (cores, memory, duration) asked that found no victims: one
    # asking as much or more of each (the default compares only with the default) finds none.
    hopeless: dict[tuple, list[tuple]] = {}
    for request, _ in ranked:
        level = policy.qos_level(request.qos)
        shape = (request.gpus, request.mig_profile, request.device_match, level)
        asked = (request.cpus, request.memory_mib, request.duration_s)
        if level <= lowest or any(_covers(seen, asked) for seen in hopeless.get(shape, ())):
            continue
        # How long a shape fits from now does not depend on its QOS: keyed without it.
        if not _eligible(run, request, shape[:3] + asked[:2], fits_now):
            continue
        choice = _cheapest(run, request, level, by_node)
        if choice is None:
            hopeless.setdefault(shape, []).append(asked)
            continue
        parts, victims = choice
        if run.host_start(request, Fit(run.now, parts)) != run.now:
            continue  # its limits of cores or memory would not let it start on them
        graced = request.submit_time + policy.preempt_grace_s
        if graced > run.now:  # not yet: nothing is stopped in this pass
            ids = tuple(v.booking_id for v in victims)
            run.preempt_later[request.booking_id] = PreemptLater(ids, graced)
            continue
        for victim in victims:
            release_victim(run, victim, by_node)
            preemptions.append(Preemption(victim.booking_id, request.booking_id))
        preempting[request.booking_id] = Fit(run.now, parts)
        run.reserve(request, preempting[request.booking_id])
        fits_now.clear()
    return preemptions, preempting


def _covers(seen: tuple, asked: tuple) -> bool:
    """Whether ``asked`` (cores, memory, duration) asks at least ``seen`` of each: the same
    default (None) or no fewer explicit cores (memory), and no shorter a duration."""
    for had, has in zip(seen, asked, strict=True):
        if (had is None) != (has is None) or (had is not None and has < had):
            return False
    return True


def _preemptible_by_node(run) -> dict[int, list[Allocation]]:
    """Running preemptible allocations on up nodes, listed under every node they touch."""
    by_node: dict[int, list[Allocation]] = {}
    for alloc in run.state.allocations:
        # A borrowed booking is always preemptible (scheduler/borrowing.py).
        preemptible = alloc.preemptible or alloc.borrowed
        if alloc.running and preemptible and alloc.start <= run.now < alloc.end:
            nodes = {run.where[d][0] for d in alloc.device_ids if d in run.where}
            for node in nodes:
                if node.up:
                    by_node.setdefault(node.index, []).append(alloc)
    return by_node


def _eligible(run, request: Request, shape: tuple, fits_now: dict) -> bool:
    """Within quota now and not fitting already (the grace period is the caller's)."""
    now, duration = run.now, request.duration_s
    ledgers = run.quotas.of(request.user, request.project, request.array)
    if ledgers and run.quotas.earliest(ledgers, run.size(request), duration, now) != now:
        return False
    # Its devices alone first (one horizon per device shape): where they do not fit now, its
    # cores and memory cannot make it fit; only where they do is its own demand asked.
    for key, resources in ((shape[:3], False), (shape, True)):
        if key not in fits_now:
            timelines = [node.timeline for node in run.nodes]
            multi = is_multi_node(request, run.nodes)
            fits_now[key] = fit_horizon(run.nodes, timelines, request, multi, now, resources)
        horizon = fits_now[key]
        if horizon is None or now + duration > horizon:
            return True
        if not run.finder.resourced:
            break
    return False


def _cheapest(run, request: Request, level: int, by_node: dict[int, list[Allocation]]):
    """(parts, victims) for ``request``: on one node or on whole nodes, of one model where it
    keeps one (``placement.searches``): the lowest-QOS, then fewest, victims; or None."""
    multi = is_multi_node(request, run.nodes)
    best_of = _best_whole_nodes if multi else _best_victims
    if request.fractional:
        best_of = sharing.best_victims
    best = None
    for choice in searches(request, run.finder.site, multi):
        found = best_of(run, choice, level, by_node)
        if found is not None:
            levels = [run.policy.qos_level(victim.qos) for victim in found[1]]
            key = (max(levels, default=-1), len(levels))
            if best is None or key < best[0]:
                best = (key, found)
    return None if best is None else best[1]


def _best_whole_nodes(run, request: Request, level: int, by_node: dict[int, list[Allocation]]):
    """(parts, victims) for a multi-node request: the cheapest whole nodes to clear, or None.

    A node qualifies when it is free or every booking on it that is in the way is preemptible
    and of lower QOS; nodes are taken cheapest first (highest victim QOS, then victim count).
    """
    now, end = run.now, run.now + request.duration_s
    candidates = []
    for node in run.nodes:
        if not (node.up and node.whole and node.need(None, request.device_match) == node.full):
            continue
        if held_for_others(run, node.index, request, end):
            continue
        free = node.timeline.free_mask(now, end)
        lower = [a for a in by_node.get(node.index, ()) if run.policy.qos_level(a.qos) < level]
        for alloc in lower:
            free |= freed_bits(run, node, alloc, node.full, end)
        if free != node.full:
            continue
        if node.capacity is not None and not _fits_freed(run, node, request, lower, end):
            continue  # even with all of them stopped its cores or memory are not free
        levels = [run.policy.qos_level(a.qos) for a in lower]
        candidates.append(((max(levels, default=-1), len(lower)), node.cool, node.index, lower))
    chosen, total = [], 0
    for candidate in sorted(candidates, key=lambda c: c[:3]):
        chosen.append(candidate)
        total += run.nodes[candidate[2]].full.bit_count()
        if total >= request.gpus:
            victims = {a.booking_id: a for c in chosen for a in c[3]}
            parts = tuple((c[2], run.nodes[c[2]].full) for c in chosen)
            return parts, [victims[k] for k in sorted(victims)]
    return None


def _best_victims(run, request: Request, level: int, by_node: dict[int, list[Allocation]]):
    """(parts, victims) with the lowest-QOS, then fewest, victims on one node, or None."""
    end = run.now + request.duration_s
    best = None
    for index in sorted(by_node):
        node = run.nodes[index]
        room = room_on(run, index, request, request.mig_profile, request.device_match, end)
        if room is None:
            continue
        need, free = room
        options = []
        for alloc in by_node[index]:
            alloc_level = run.policy.qos_level(alloc.qos)
            bits = freed_bits(run, node, alloc, need, end) if alloc_level < level else 0
            if bits:
                options.append((alloc_level, bits, alloc.booking_id))
        combo = fewest_victims(options, request.gpus - free.bit_count()) if options else None
        if node.capacity is not None:
            combo = room_after(run, node, request, combo, options, by_node[index], end)
        if combo is None:
            continue
        levels = [victim[0] for victim in combo]
        key = (max(levels), len(combo), sum(levels), node.index)
        if best is None or key < best[0]:
            freed, chosen = freed_by(free, combo, by_node[index])
            best = (key, node.index, node.choose(freed, request.gpus), chosen)
    if best is None:
        return None
    _, index, mask, chosen = best
    return ((index, mask),), chosen


def room_after(run, node, request: Request, combo, options, allocs, end: float):
    """``combo`` (victims that free the devices), with more of ``options`` added, lowest QOS
    first, until their freed cores and memory leave room for ``request`` on ``node`` over
    [now, end) too; None when even all of them do not (or no devices were freed)."""
    if combo is None and options:
        return None
    picked = list(combo or ())
    rest = sorted((o for o in options if o not in picked), key=lambda o: (o[0], o[2]))
    while True:
        ids = {victim[2] for victim in picked}
        if _fits_freed(run, node, request, [a for a in allocs if a.booking_id in ids], end):
            return tuple(picked) if picked else None
        if not rest:
            return None
        picked.append(rest.pop(0))


def _fits_freed(run, node, request: Request, victims, end: float) -> bool:
    """Whether ``request``'s cores and memory fit on ``node`` over [now, end) once ``victims``
    stop (what they hold there given back, ``placement.held_demands``)."""
    trial = node.timeline.res.copy()
    for alloc in victims:
        for where, demand in held_demands(alloc, run.where):
            if where is node:
                trial.add(-demand[0], -demand[1], run.now, alloc.end)
    cpus, memory = node.demand_of(request)
    return trial.fits(cpus, memory, run.now, max(end, run.now + 1e-9))


def room_on(run, index: int, request: Request, profile, match, end: float, gpus=None):
    """(need, free) on node ``index`` for a booking that would stop others to start now: the
    devices of this shape it may use (never other projects' holds) and those of them free over
    [now, end); None when fewer than ``gpus`` (default: the request's) match."""
    node = run.nodes[index]
    need = node.need(profile, match) & ~held_for_others(run, index, request, end)
    if need.bit_count() < (request.gpus if gpus is None else gpus):
        return None
    return need, node.timeline.free_mask(run.now, end) & need


def freed_by(free: int, combo, allocs: list[Allocation]) -> tuple[int, list[Allocation]]:
    """The mask free once the victims ``combo`` (cost, bits, booking id) stop, and their
    allocations among ``allocs``."""
    for victim in combo:
        free |= victim[1]
    ids = {victim[2] for victim in combo}
    return free, [a for a in allocs if a.booking_id in ids]


def held_for_others(run, index: int, request: Request, end: float) -> int:
    """Devices of node ``index`` other projects' holds set aside before ``end`` (a preemptor
    never takes them)."""
    if not run.project_holds:
        return 0
    return run.project_holds.reserved_bits(index, request.project, run.now, end)


def freed_bits(run, node, alloc: Allocation, need: int, end: float) -> int:
    """Devices of ``alloc`` on ``node`` that would be free until ``end`` once it stops."""
    bits = 0
    if not run.calendar.clear(node, run.now, end):
        return bits  # a maintenance window there: stopping it frees nothing in time
    for device_id in alloc.device_ids:
        where = run.where.get(device_id)
        if where is None or where[0] is not node or not (need >> where[1] & 1):
            continue
        if alloc.end >= end or node.timeline.free_mask(alloc.end, end) >> where[1] & 1:
            bits |= 1 << where[1]
    return bits


def release_victim(run, alloc: Allocation, by_node: dict[int, list[Allocation]]) -> None:
    """Free a victim's devices and quota use, and drop it from the candidates."""
    for allocs in by_node.values():
        if alloc in allocs:
            allocs.remove(alloc)
    for device_id in alloc.device_ids:
        where = run.where.get(device_id)
        if where is not None and where[0].up:
            if where[0].devices[where[1]].shared:
                sharing.release(where[0], where[1], alloc, run.now)
            else:
                where[0].timeline.release(1 << where[1], run.now, alloc.end)
                run.calendar.reblock(where[0], run.now, alloc.end)
            if run.project_holds:
                run.project_holds.reblock(where[0])  # a hold's devices stay held
    for node, demand in held_demands(alloc, run.where):
        if node.up:
            node.timeline.hold(-demand[0], -demand[1], run.now, alloc.end)
    for ledger in run.quotas.of(alloc.user, alloc.project, alloc.array):
        ledger.remove(alloc.booking_id)
