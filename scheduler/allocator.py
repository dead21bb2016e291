"""The allocation pass: ``plan(state, policy) -> Plan``. Pure: no Django, no I/O, no clock.

One pass sorts the pending bookings (protected ones first, then in ``Policy.order``: by default
the highest response ratio), lets eligible high-QOS bookings preempt, then walks the queue in
that order and gives every booking the earliest start that fits on the devices, the quotas and
every reservation made before it; the bookings that hold a reservation (all of them under
conservative backfill, the protected ones and the first that cannot start under easy) are never
delayed by later ones. Bookings whose planned start is ``now`` start now.
"""

from __future__ import annotations

import heapq
import math

from scheduler.dependencies import dependency_verdicts
from scheduler.placement import Finder, Fit, build_nodes, fit_horizon, fits_window, is_multi_node
from scheduler.preemption import PreemptLater, preempt_phase
from scheduler.priority import (
    fairshare_factors,
    priority_of,
    profile_fractions,
    request_size,
    site_scales,
)
from scheduler.quota import ArrayLedger, Quotas
from scheduler.timeline import INF, NodeTimeline
from scheduler.types import (
    REASON_ARRAY_LIMIT,
    REASON_DEPENDENCY,
    REASON_NEVER,
    REASON_NODE_DOWN,
    REASON_PREEMPTING,
    REASON_PRIORITY,
    REASON_QUOTA,
    REASON_RESERVATION,
    REASON_RESOURCES,
    REASON_STARTING,
    REASON_TOPOLOGY,
    Allocation,
    Plan,
    Planned,
    Policy,
    Priority,
    Request,
    Start,
    State,
)


def plan(
    state: State, policy: Policy, *, starts_only: bool = False, until: str | None = None
) -> Plan:
    """Decide which pending bookings start now, plan the rest, and list the preemptions to make.

    ``starts_only`` (the trace replay, which needs only the starts) stops the walk once no
    device of an up node is free now: nothing later in the order could start, so the starts and
    preemptions are the same, and ``planned`` lists only the bookings walked.

    ``until`` (the estimate) stops the walk once the booking of that id has been planned: the
    walk is in priority order and a booking's line depends only on the bookings before it, so
    its line is the same as in the whole pass, and ``planned`` ends with it. The bookings before
    it past the reservation depth get no estimate (start None): an estimate holds nothing, so
    its line does not depend on theirs.
    """
    return _Pass(state, policy).run(starts_only, until)


class _Pass:
    """Working state of one allocation pass (mutable inside, discarded after)."""

    def __init__(self, state: State, policy: Policy) -> None:
        self.state, self.policy, self.now = state, policy, state.now
        nodes = build_nodes(state.devices, state.now)
        self.nodes = [node for node in nodes if node.up]
        self.down = [node for node in nodes if not node.up]
        for index, node in enumerate(self.nodes):
            node.index = index
        self.where = {dev.id: (node, bit) for node in nodes for bit, dev in enumerate(node.devices)}
        self.fractions = profile_fractions(state.devices)
        self.capacity = sum(dev.fraction for node in self.nodes for dev in node.devices)
        self.quotas = Quotas(state.user_quotas, state.project_quotas, self._array_ledgers())
        # A booking waiting on a dependency is not eligible: it neither starts, nor holds a
        # reservation, nor preempts.
        self.waiting = dependency_verdicts(state.pending, state.outcomes)
        # Bookings that will preempt once their grace period is over (filled by preempt_phase).
        self.preempt_later: dict[str, PreemptLater] = {}
        self._load_allocations()
        running = [
            a.end - a.start for a in state.allocations if a.running and a.start <= self.now < a.end
        ]
        self.scales = site_scales(policy, self.capacity, running)
        # Protection never overrides QOS (the site's own precedence): it applies among the
        # pending bookings of the highest QOS level present.
        self.top_qos = max((policy.qos_level(r.qos) for r in state.pending), default=0)
        by_age = heapq.nsmallest(
            policy.protect_oldest,
            (r for r in state.pending if policy.qos_level(r.qos) == self.top_qos),
            key=lambda r: (r.submit_time, r.booking_id),
        )
        self.oldest = {request.booking_id for request in by_age}
        self.handed: list[tuple[float, str] | None] = []  # each hand-on of protection, in order
        self.fixed = [_copy(node.timeline) for node in self.nodes]
        self.finder = Finder(self.nodes, state.now)
        self._why_cache: dict[tuple, tuple[float | None, float | None]] = {}

    def _array_ledgers(self) -> dict[str, ArrayLedger]:
        ledgers: dict[str, ArrayLedger] = {}
        for request in self.state.pending:
            if request.array and request.array_limit and request.array not in ledgers:
                size = self.size(request)
                ledgers[request.array] = ArrayLedger(request.array, request.array_limit, size)
        return ledgers

    def _load_allocations(self) -> None:
        now = self.now
        for alloc in self.state.allocations:
            if alloc.end <= now:
                continue  # overran its end: the portal is stopping it, treat it as gone
            self.quotas.add(
                alloc.user,
                alloc.project,
                (max(alloc.start, now), alloc.end),
                self.held(alloc),
                alloc.booking_id,
                alloc.array,
            )
            for device_id in alloc.device_ids:
                if device_id in self.where:
                    node, bit = self.where[device_id]
                    node.timeline.occupy(1 << bit, max(alloc.start, now), alloc.end)

    def held(self, alloc: Allocation) -> float:
        """GPU-equivalents a live allocation holds on the known devices."""
        where = self.where
        return sum(
            where[d][0].devices[where[d][1]].fraction for d in alloc.device_ids if d in where
        )

    def size(self, request: Request) -> float:
        """GPU-equivalents of a request."""
        return request_size(request, self.fractions)

    def ordered(self) -> list[tuple[Request, Priority]]:
        """Pending bookings with their priority, highest first (ties: older first, then id)."""
        state = self.state
        projects = {request.project for request in state.pending}
        fair = fairshare_factors(projects, state.project_shares, state.project_usage)
        ranked = [
            (
                request,
                priority_of(
                    request,
                    self.now,
                    self.size(request),
                    fair[request.project],
                    self.policy,
                    self.scales,
                ),
            )
            for request in state.pending
        ]
        ranked.sort(key=self._rank)
        return ranked

    def _rank(self, pair: tuple[Request, Priority]) -> tuple:
        """Sort key: protected bookings first in arrival order, then in ``Policy.order`` (by
        priority, or by QOS level then the order's key), then age, then id."""
        request, prio = pair
        if self.protected(request):
            return (0, request.submit_time, 0.0, request.booking_id)
        if self.policy.order == "priority":
            return (1, -prio.total, request.submit_time, request.booking_id)
        level = -self.policy.qos_level(request.qos)
        return (1, level, self._order_key(request), request.submit_time, request.booking_id)

    def _order_key(self, request: Request) -> float:
        """Smaller walks first: GPU-seconds (sjf), minus the response ratio (hrrn), 0 (arrival)."""
        order = self.policy.order
        if order == "sjf":
            return self.size(request) * request.duration_s
        if order == "hrrn":
            duration = max(request.duration_s, 1.0)
            return -(self.now - request.submit_time + duration) / duration
        return 0.0

    def protected(self, request: Request) -> bool:
        """Pending at least the protection age: it goes first and nothing later may delay it.

        Protected bookings are walked first, in arrival order, so each one's reservation is
        planned against running allocations, advance reservations and older protected bookings
        only: a booking submitted after it can never take its place (docs/scheduling.md, "The
        no-starvation bound"). Only bookings of the highest QOS pending are protected.
        """
        if request.booking_id in self.oldest:
            return True
        after = self.scales.protect_after_s
        if after is None or self.now - request.submit_time < after:
            return False
        return self.policy.qos_level(request.qos) == self.top_qos

    def run(self, starts_only: bool = False, until: str | None = None) -> Plan:
        """The whole pass (or its walk up to and including booking ``until``)."""
        ranked = self.ordered()
        eligible = [pair for pair in ranked if pair[0].booking_id not in self.waiting]
        preemptions, preempting = preempt_phase(self, eligible)
        walk = _Walk(self, preempting, until)
        planned: list[Planned] = []
        while len(planned) < len(ranked):
            if starts_only and not self.free_now():
                break
            line = self.step(walk, ranked, len(planned))
            planned.append(line)
            if line.booking_id == until:
                break
        never_met = tuple(bid for bid, verdict in self.waiting.items() if verdict.never)
        return Plan(
            starts=tuple(walk.starts),
            planned=tuple(planned),
            preemptions=tuple(preemptions),
            never_met=never_met,
        )

    def step(self, walk: _Walk, ranked: list[tuple[Request, Priority]], done: int) -> Planned:
        """Place ``ranked[done]`` (the first ``done`` are placed); when one of the oldest starts,
        hand its protection on. The one step of the walk, for ``run`` and the kept walk."""
        request, prio = ranked[done]
        line = walk.place(done + 1, request, prio)
        if line.reason == REASON_STARTING and request.booking_id in self.oldest:
            self.handed.append(self._hand_on(ranked, done + 1))
        return line

    def _hand_on(
        self, ranked: list[tuple[Request, Priority]], walked: int
    ) -> tuple[float, str] | None:
        """One of the oldest bookings starts now: the next oldest not yet protected takes its
        place (EASY's head: the oldest booking that cannot start), walked next after the
        protected ones still to walk. Returns its (submit time, id), or None: nobody took it."""
        rest = range(walked, len(ranked))
        first = next((i for i in rest if not self.protected(ranked[i][0])), None)
        if first is None:
            return None
        candidates = [
            i
            for i in range(first, len(ranked))
            if self.policy.qos_level(ranked[i][0].qos) == self.top_qos
        ]
        if not candidates:
            return None
        oldest = min(candidates, key=lambda i: (ranked[i][0].submit_time, ranked[i][0].booking_id))
        self.oldest.add(ranked[oldest][0].booking_id)
        ranked.insert(first, ranked.pop(oldest))
        return ranked[first][0].submit_time, ranked[first][0].booking_id

    def free_now(self) -> bool:
        """Some device of an up node is free at this instant (timelines start at now)."""
        return any(node.timeline.masks[0] for node in self.nodes)

    def device_ids(self, fit: Fit) -> tuple[str, ...]:
        """Device ids of a fit, in node then bit order."""
        ids = []
        for index, mask in fit.parts:
            node = self.nodes[index]
            ids.extend(dev.id for bit, dev in enumerate(node.devices) if mask >> bit & 1)
        return tuple(ids)

    def reserve(self, request: Request, fit: Fit) -> None:
        """Hold the fit's devices and count the use against quotas."""
        end = fit.start + request.duration_s
        for index, mask in fit.parts:
            self.nodes[index].timeline.occupy(mask, fit.start, end)
        amount = self.size(request)
        span = (fit.start, end)
        self.quotas.add(
            request.user, request.project, span, amount, request.booking_id, request.array
        )
        for ledger in self.quotas.of(request.user, request.project, request.array):
            ledger.planned_hours += amount * request.duration_s / 3600.0

    def why(self, request: Request, multi: bool) -> tuple[str, str]:
        """Reason and detail for a booking that has a start later than now (quota aside)."""
        # Keyed by shape, not duration: one horizon per shape answers every duration.
        key = (request.gpus, request.mig_profile, request.device_match, multi)
        horizons = self._why_cache.get(key)
        if horizons is None:
            horizons = self._why_cache[key] = self._horizons(request, multi)
        fixed, everywhere = horizons
        if fixed is not None and self.now + request.duration_s <= fixed:
            return REASON_PRIORITY, "devices are free now but held for higher-priority bookings"
        if fixed is not None:
            return REASON_RESERVATION, "an advance reservation holds the devices during its window"
        if everywhere is not None:
            return REASON_NODE_DOWN, "it would fit now on nodes that are down or draining"
        return REASON_RESOURCES, "all matching devices are in use"

    def _horizons(self, request: Request, multi: bool) -> tuple[float | None, float | None]:
        now = self.now
        fixed = fit_horizon(self.nodes, self.fixed, request, multi, now)
        everywhere = None
        if self.down:
            everything = self.nodes + self.down
            timelines = self.fixed + [node.timeline for node in self.down]
            everywhere = fit_horizon(everything, timelines, request, multi, now)
        return fixed, everywhere

    def never(self, request: Request) -> tuple[str, str]:
        """Reason and detail for a booking no up node can ever hold."""
        everything = self.nodes + self.down
        multi = is_multi_node(request, everything)
        timelines = [NodeTimeline(self.now, node.full) for node in everything]
        if self.down and fits_window(everything, timelines, request, multi, self.now, self.now):
            names = ", ".join(node.name for node in self.down)
            return REASON_NODE_DOWN, f"needs devices on nodes that are down or draining ({names})"
        return REASON_NEVER, "no devices in the cluster match this request"


# Reasons a booking waits for something other than devices: preempting does not help.
_NOT_BY_DEVICES = {REASON_STARTING, REASON_DEPENDENCY, REASON_QUOTA, REASON_ARRAY_LIMIT}


def _copy(timeline: NodeTimeline) -> NodeTimeline:
    twin = NodeTimeline(timeline.times[0], 0)
    twin.times, twin.masks = list(timeline.times), list(timeline.masks)
    return twin


class _Walk:
    """The priority-order walk that plans every pending booking."""

    def __init__(self, run: _Pass, preempting: dict[str, Fit], until: str | None = None) -> None:
        self.run, self.preempting, self.until = run, preempting, until
        self.starts: list[Start] = []
        self.reserved = 0
        self.last_start = run.now
        policy = run.policy
        self.depth = 1 if policy.backfill == "easy" else policy.reservation_depth
        self.strict = policy.backfill == "none"
        self.failed: dict[tuple, dict[int, float]] = {}

    def place(self, position: int, request: Request, prio: Priority) -> Planned:
        """Plan one booking (in priority order) and return its Planned line."""
        run = self.run

        later = run.preempt_later.get(request.booking_id)

        def planned(start, fit, reason, detail):
            ids = run.device_ids(fit) if fit is not None else ()
            if (
                later is not None
                and reason not in _NOT_BY_DEVICES
                and later.at < (INF if start is None else start)
            ):
                # It will start by preempting once its grace is over, before the devices free
                # up. The line keeps the walk's own start and devices, which it holds for it (a
                # bound, in case the victims end first): the grace's end on the victims'
                # devices would overlap what they hold until then.
                reason, detail = REASON_PREEMPTING, later.detail
            return Planned(request.booking_id, start, ids, position, reason, detail, prio)

        waiting = run.waiting.get(request.booking_id)
        if waiting is not None:
            return planned(None, None, REASON_DEPENDENCY, waiting.detail)
        if request.booking_id in self.preempting:
            fit = self.preempting[request.booking_id]
            return planned(
                run.now, fit, REASON_PREEMPTING, "lower-QOS bookings are being preempted"
            )
        ledgers = run.quotas.of(request.user, request.project, request.array)
        amount = run.size(request)
        over = run.quotas.over_budget(ledgers, amount * request.duration_s / 3600.0)
        if over:
            return planned(None, None, REASON_QUOTA, over)
        multi = is_multi_node(request, run.nodes)
        # A protected booking always holds its reservation, whatever the depth (the bound).
        holds = run.protected(request) and not self.strict
        if not holds and self._skip_estimate(request, multi, ledgers, amount):
            return planned(None, None, *self._explained(request, multi, ledgers, amount))
        fit = self._search(request, multi, ledgers, amount)
        if fit is None:
            below = run.quotas.below(ledgers, amount)
            if below:
                return planned(None, None, REASON_QUOTA, below)
            return planned(None, None, *run.never(request))
        waited = None if holds else self._topology_wait(request, multi, ledgers, amount, fit)
        could_start = fit.start == run.now
        fit = waited or fit
        if self.strict:
            self.last_start = fit.start
        if fit.start == run.now:
            run.reserve(request, fit)
            self.starts.append(Start(request.booking_id, run.device_ids(fit)))
            return planned(fit.start, fit, REASON_STARTING, "starts now")
        reason = self._explained(request, multi, ledgers, amount)
        if waited is not None and could_start:
            wait = run.policy.topology_wait_s
            reason = REASON_TOPOLOGY, f"waits up to {wait:g} s for a better-connected set of GPUs"
        if not holds and self.depth is not None and self.reserved >= self.depth:
            return planned(fit.start, None, *reason)  # estimate only: no devices held
        self.reserved += 1  # a protected booking's reservation counts towards the depth too
        run.reserve(request, fit)
        return planned(fit.start, fit, *reason)

    def _topology_wait(
        self, request: Request, multi: bool, ledgers, amount: float, fit: Fit
    ) -> Fit | None:
        """A fit on a better-connected set at most ``Policy.topology_wait_s`` after ``fit``
        that the quotas allow as well, or None (``fit`` stands)."""
        run = self.run
        wait = run.policy.topology_wait_s
        if not wait or multi or request.mig_profile is not None or request.gpus < 2:
            return None
        better = run.finder.better(request, fit, fit.start + wait)
        if better is None or better.start == fit.start:
            return better
        if ledgers:
            allowed = run.quotas.earliest(ledgers, amount, request.duration_s, better.start)
            if allowed != better.start:
                return None
        return better

    def _skip_estimate(self, request: Request, multi: bool, ledgers, amount: float) -> bool:
        """Past the reservation depth with estimate_all off: plan only what starts now."""
        run = self.run
        wanted = self.until is None or request.booking_id == self.until
        if (run.policy.estimate_all and wanted) or self.depth is None or self.reserved < self.depth:
            return False
        if self.strict and self.last_start > run.now:
            return True
        if run.quotas.blocking_now(ledgers, amount, run.now, request.duration_s):
            return True
        # Past the depth nothing more is reserved, only started: free devices only shrink, so a
        # request at least as wide and as long as one that did not fit now does not fit either.
        failed = self.failed.setdefault((request.mig_profile, request.device_match, multi), {})
        if any(g <= request.gpus and d <= request.duration_s for g, d in failed.items()):
            return True
        timelines = [node.timeline for node in run.nodes]
        end = run.now + request.duration_s
        if fits_window(run.nodes, timelines, request, multi, run.now, end):
            return False
        failed[request.gpus] = min(failed.get(request.gpus, math.inf), request.duration_s)
        return True

    def _search(self, request: Request, multi: bool, ledgers, amount: float) -> Fit | None:
        """Earliest start that both the devices and the quotas allow."""
        run, t = self.run, self.last_start if self.strict else self.run.now
        if not ledgers:
            return run.finder.find(request, multi, t)
        while True:
            t = run.quotas.earliest(ledgers, amount, request.duration_s, t)
            if t is None:
                return None
            fit = run.finder.find(request, multi, t)
            if fit is None or fit.start == t:
                return fit
            t = fit.start

    def _explained(self, request: Request, multi: bool, ledgers, amount: float) -> tuple[str, str]:
        if not self.run.policy.explain:
            return REASON_RESOURCES, ""
        return self._reason(request, multi, ledgers, amount)

    def _reason(self, request: Request, multi: bool, ledgers, amount: float) -> tuple[str, str]:
        run = self.run
        quotas = [ledger for ledger in ledgers if not isinstance(ledger, ArrayLedger)]
        blocked = run.quotas.blocking_now(quotas, amount, run.now, request.duration_s)
        if blocked:
            return REASON_QUOTA, blocked
        arrays = [ledger for ledger in ledgers if isinstance(ledger, ArrayLedger)]
        blocked = run.quotas.blocking_now(arrays, amount, run.now, request.duration_s)
        if blocked:
            return REASON_ARRAY_LIMIT, blocked
        return run.why(request, multi)
