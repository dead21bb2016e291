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

from scheduler import sharing
from scheduler.borrowing import borrow_phase, reclaim_phase
from scheduler.calendar import Calendar, maintenance_detail
from scheduler.dependencies import dependency_verdicts
from scheduler.holds import HoldViews
from scheduler.mig_layout import change_times
from scheduler.placement import (
    Finder,
    Fit,
    build_nodes,
    fit_horizon,
    fits_window,
    held_demands,
    is_multi_node,
)
from scheduler.preemption import PreemptLater, preempt_phase
from scheduler.priority import (
    fairshare_factors,
    priority_of,
    profile_fractions,
    request_size,
    site_scales,
)
from scheduler.quota import ArrayLedger, Quotas
from scheduler.resources import total_demand
from scheduler.shortfall import free_at, never_held, short_of
from scheduler.timeline import INF, NodeTimeline
from scheduler.types import (
    REASON_ARRAY_LIMIT,
    REASON_DEPENDENCY,
    REASON_MAINTENANCE,
    REASON_MIG_CHANGE,
    REASON_NEVER,
    REASON_NODE_DOWN,
    REASON_PREEMPTING,
    REASON_PRIORITY,
    REASON_PROJECT_RESERVATION,
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

# The horizons ``_Pass.why`` reads, by index in ``_Pass._horizons``.
FIXED, EVERYWHERE, UNCHANGED, UNHELD = range(4)


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
    its line does not depend on theirs. Only that booking may start borrowed then
    (``borrowing.borrow_phase``).
    """
    return _Pass(state, policy).run(starts_only, until)


class _Pass:
    """Working state of one allocation pass (mutable inside, discarded after)."""

    def __init__(self, state: State, policy: Policy) -> None:
        self.state, self.policy, self.now = state, policy, state.now
        nodes = build_nodes(state.devices, state.now, state.node_resources, policy)
        self.calendar = Calendar(state.windows, nodes, state.now)  # maintenance windows
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
        self.project_holds = HoldViews(state.holds, self.where, state.now)
        # Bookings that reclaim borrowed devices in this pass, with their detail (reclaim_phase).
        self.reclaiming: dict[str, str] = {}
        self._load_allocations()
        # Timelines of the up nodes without the windows (None: no window), for the reason.
        self.bare = self.calendar.block(self.nodes)
        self.calendar.block(self.down)
        # Timelines as the allocations leave them, before the MIG changes' holds (None: none).
        self.unchanged = self._hold_for_mig_changes()
        if self.project_holds:
            self.project_holds.setup(self.nodes)
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
        self._bare_cache: dict[tuple, float | None] = {}
        self._short_cache: dict[tuple, object] = {}
        # Per device shape, the nodes whose devices are free now (``_short_now``).
        self._free_fixed: dict[tuple, list[int]] = {}
        self._free_now: dict[tuple, list[int]] = {}

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
            if not self._drawn(alloc, now):
                span = (max(alloc.start, now), alloc.end)
                self.quotas.add(
                    alloc.user,
                    alloc.project,
                    span,
                    self.held(alloc),
                    alloc.booking_id,
                    alloc.array,
                    borrowed=alloc.borrowed,
                )
                hosts = self.quotas.host_of(alloc.user, alloc.project)
                if hosts:
                    held = total_demand([d for _, d in held_demands(alloc, self.where)])
                    self.quotas.add_host(hosts, span, held, alloc.booking_id)
            for device_id in alloc.device_ids:
                if device_id in self.where:
                    node, bit = self.where[device_id]
                    span = (max(alloc.start, now), alloc.end)
                    device = node.devices[bit]
                    if device.shared:
                        held = sharing.held_on(device, alloc.share, alloc.gpu_memory_mib)
                        shares = sharing.share_timeline(node.timeline, bit, device)
                        node.timeline.hold_share(bit, shares, *held, *span)
                    else:  # a fraction left on a GPU made exclusive holds all of it
                        node.timeline.occupy(1 << bit, *span)
            for node, demand in held_demands(alloc, self.where):
                node.timeline.hold(*demand, max(alloc.start, now), alloc.end)

    def _hold_for_mig_changes(self) -> list[NodeTimeline] | None:
        """Hold the slices of every GPU with a planned MIG layout change from its change time
        on (``mig_layout.change_times``): nothing planned on them may cross it."""
        self.mig_at = change_times(self.state)
        if not self.mig_at:
            return None
        unchanged = [_copy(node.timeline) for node in self.nodes]
        for device in self.state.devices:
            at = self.mig_at.get(device.parent or device.id)
            if at is not None:
                node, bit = self.where[device.id]
                node.timeline.occupy(1 << bit, at, INF)
        return unchanged

    def _drawn(self, alloc: Allocation, now: float) -> bool:
        """Whether a live allocation lies on its project's holds (and so is not counted)."""
        holds = self.project_holds
        if not holds or alloc.project not in holds.projects:
            return False
        parts: dict[int, int] = {}
        for device_id in alloc.device_ids:
            node, bit = self.where.get(device_id, (None, 0))
            if node is None or not node.up:
                return False
            parts[node.index] = parts.get(node.index, 0) | 1 << bit
        return holds.exempt(alloc.project, parts.items(), max(alloc.start, now), alloc.end)

    def held(self, alloc: Allocation) -> float:
        """GPU-equivalents a live allocation holds on the known devices (a fraction: its
        share)."""
        where = self.where
        known = [where[d][0].devices[where[d][1]] for d in alloc.device_ids if d in where]
        if alloc.share < 1.0:
            return alloc.share * len(known)
        return sum(device.fraction for device in known)

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
        preemptions += reclaim_phase(self, eligible, preempting, preemptions)
        walk = _Walk(self, preempting, until)
        planned: list[Planned] = []
        reclaiming = len(self.reclaiming)  # they start when walked, with no device free left
        while len(planned) < len(ranked):
            if starts_only and not self.free_now() and not reclaiming:
                break
            line = self.step(walk, ranked, len(planned))
            planned.append(line)
            reclaiming -= line.booking_id in self.reclaiming
            if line.booking_id == until:
                break
        borrow_phase(self, walk, planned, only=until)
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
        """Some device of an up node is free at this instant (timelines start at now); with
        project holds, always (a member may still draw on one)."""
        return (
            bool(self.project_holds)
            or any(node.timeline.masks[0] for node in self.nodes)
            or sharing.free_now(self.nodes)
        )

    def device_ids(self, fit: Fit) -> tuple[str, ...]:
        """Device ids of a fit, in node then bit order."""
        ids = []
        for index, mask in fit.parts:
            node = self.nodes[index]
            ids.extend(dev.id for bit, dev in enumerate(node.devices) if mask >> bit & 1)
        return tuple(ids)

    def reserve(self, request: Request, fit: Fit, counted: bool = True) -> None:
        """Hold the fit's devices (a fraction: its share of the shared GPU) and count the use
        against quotas (not ``counted``: it draws on its project's holds, only the GPU-hour
        budgets see it)."""
        end = fit.start + request.duration_s
        if self.project_holds:
            self.project_holds.occupy(fit.parts, fit.start, end, self.demands(request, fit))
        amount = self.size(request)
        for index, mask in fit.parts:
            node = self.nodes[index]
            if request.fractional:
                amount = self.hold_share(request, node, mask, fit.start, end)
            else:
                node.timeline.occupy(mask, fit.start, end)
                node.timeline.hold(*node.demand_of(request), fit.start, end)
        span = (fit.start, end)
        if counted:
            self.quotas.add(
                request.user, request.project, span, amount, request.booking_id, request.array
            )
            hosts = self.quotas.host_of(request.user, request.project)
            if hosts:
                held = total_demand(self.demands(request, fit))
                self.quotas.add_host(hosts, span, held, request.booking_id)
        for ledger in self.quotas.of(request.user, request.project, request.array):
            ledger.planned_hours += amount * request.duration_s / 3600.0

    def demands(self, request: Request, fit: Fit) -> list[tuple[int, int]]:
        """Cores and memory ``request`` holds on each part's node of ``fit``."""
        out = []
        for index, mask in fit.parts:
            node = self.nodes[index]
            if request.fractional:
                device = node.devices[mask.bit_length() - 1]
                compute = sharing.share_on(request, device)[0]
                out.append(sharing.demand_of(node, request, compute))
            else:
                out.append(node.demand_of(request))
        return out

    def host_start(self, request: Request, fit: Fit) -> float | None:
        """The earliest start from ``fit.start`` its user's and project's limits of cores and
        memory allow for what it would hold on ``fit`` (``fit.start`` itself: they allow it;
        None: a limit is below it)."""
        hosts = self.quotas.host_of(request.user, request.project)
        if not hosts:
            return fit.start
        held = total_demand(self.demands(request, fit))
        return self.quotas.earliest(hosts, held, request.duration_s, fit.start)

    def host_refusal(self, request: Request, fit: Fit) -> str | None:
        """The sentence of the cores or memory limit that keeps ``request`` off ``fit`` at
        ``fit.start``, else None."""
        hosts = self.quotas.host_of(request.user, request.project)
        held = total_demand(self.demands(request, fit)) if hosts else (0, 0)
        return hosts and self.quotas.host_blocking(hosts, held, fit.start, request.duration_s)

    def start_of(self, request: Request, fit: Fit) -> Start:
        """The Start of a booking on a fit (a fraction: with what it holds there)."""
        ids = self.device_ids(fit)
        if not request.fractional:
            return Start(request.booking_id, ids)
        node, bit = self.where[ids[0]]
        share, memory = sharing.share_on(request, node.devices[bit])
        return Start(request.booking_id, ids, share, memory)

    def hold_share(self, request: Request, node, mask: int, start: float, end: float) -> float:
        """Hold a fractional request's share of the shared GPU ``mask`` names on ``node`` over
        [start, end); returns the compute share (what its quotas count)."""
        bit = mask.bit_length() - 1
        device = node.devices[bit]
        compute, memory = sharing.share_on(request, device)
        node.timeline.hold_share(
            bit, sharing.share_timeline(node.timeline, bit, device), compute, memory, start, end
        )
        node.timeline.hold(*sharing.demand_of(node, request, compute), start, end)
        return compute

    def why(self, request: Request, multi: bool) -> tuple[str, str]:
        """Reason and detail for a booking that has a start later than now (quota aside)."""
        # Keyed by shape, not duration: one horizon per shape answers every duration. Each is
        # its devices' alone first (a bound: cores and memory only shorten it); the one with
        # its cores and memory is asked only where that one leaves the reason open.
        key = (request.gpus, request.mig_profile, request.device_match, multi)
        bounds = self._why_cache.get(key)
        if bounds is None:
            bounds = self._why_cache[key] = self._horizons(request, multi, False)
        end = self.now + request.duration_s
        resourced = self.finder.resourced

        def horizon(which: int) -> float | None:
            if not resourced or bounds[which] is None:
                return bounds[which]
            full = key + (request.cpus, request.memory_mib, which)
            if full not in self._why_cache:
                self._why_cache[full] = self._horizons(request, multi, True, which)
            return self._why_cache[full]

        def within(which: int) -> bool:  # it fits there from now to its end
            if bounds[which] is None or end > bounds[which]:
                return False
            found = horizon(which)
            return found is not None and end <= found

        if within(FIXED):
            # The devices are free now on some node whose cores or memory the bookings ahead
            # took: that is what it waits for there.
            short = resourced and self._short_now(request, multi, end)
            if short:
                return short.reason, short.detail()
            return REASON_PRIORITY, "devices are free now but held for higher-priority bookings"
        if resourced and bounds[FIXED] is not None and end <= bounds[FIXED]:
            key += (request.cpus, request.memory_mib, request.duration_s)
            if key not in self._short_cache:  # the fixed timelines change only by preemption
                self._short_cache[key] = self._short_now(request, multi, end, fixed=True)
            short = self._short_cache[key]
            if short is not None:
                return short.reason, short.detail()
        if within(UNCHANGED):
            return REASON_MIG_CHANGE, self._mig_detail(request)
        if within(UNHELD):
            return REASON_PROJECT_RESERVATION, "a project reservation holds the devices"
        if horizon(FIXED) is not None:
            return REASON_RESERVATION, "an advance reservation holds the devices during its window"
        if horizon(EVERYWHERE) is not None:
            return REASON_NODE_DOWN, "it would fit now on nodes that are down or draining"
        return REASON_RESOURCES, "all matching devices are in use"

    def maintenance(
        self, request: Request, multi: bool, fit: Fit, reason: str
    ) -> tuple[str, str] | None:
        """Reason and detail when a maintenance window moved this booking's start: it starts at
        the end of a window that held its devices back, or it would fit now but for a window;
        else None."""
        nodes = [self.nodes[index] for index, _ in fit.parts]
        masks = [mask for _, mask in fit.parts]
        window = None
        if self.bare is not None:
            bare = [self.bare[index] for index, _ in fit.parts]
            window = self.calendar.ending_at(nodes, masks, fit.start, request, bare)
        # "priority": it fits now with the windows too; only the bookings ahead hold it.
        if window is None and self.bare is not None and reason != REASON_PRIORITY:
            key = (request.gpus, request.mig_profile, request.device_match, multi)
            if key not in self._bare_cache:
                horizon = fit_horizon(self.nodes, self.bare, request, multi, self.now)
                self._bare_cache[key] = horizon
            horizon, end = self._bare_cache[key], self.now + request.duration_s
            if horizon is not None and end <= horizon:
                window = self.calendar.in_the_way(self.nodes, request, end)
        return None if window is None else (REASON_MAINTENANCE, maintenance_detail(window))

    def _short_now(self, request: Request, multi: bool, end: float, fixed: bool = False):
        """``short_of`` from now to ``end`` on the fixed timelines (``fixed``) or the walk's,
        asked only of the nodes whose devices of its shape are free now: once per shape on the
        fixed ones; on the walk's, the ones still free of those free at the last ask (the walk
        only takes devices, so a node busy now stays busy and the list only shrinks)."""
        shape = (request.gpus, request.mig_profile, request.device_match, multi, request.fractional)
        timelines = self.fixed if fixed else [node.timeline for node in self.nodes]
        cache = self._free_fixed if fixed else self._free_now
        among = cache.get(shape)
        if among is None or not fixed:
            among = cache[shape] = free_at(self.nodes, timelines, request, multi, self.now, among)
        return short_of(self.nodes, timelines, request, multi, self.now, end, among)

    def _horizons(self, request: Request, multi: bool, resources: bool = True, only=None):
        """(fixed, everywhere, unchanged, unheld): how long it fits from now on the fixed
        timelines, on them with the down nodes, without planned MIG changes, without project
        holds (each None where it does not fit now; ``resources`` False: its devices alone).
        ``only``: that one of them alone, not the tuple."""
        now, res = self.now, resources
        found: list[float | None] = [None, None, None, None]
        for which in range(4) if only is None else (only,):
            if which == FIXED:
                found[which] = fit_horizon(self.nodes, self.fixed, request, multi, now, res)
            elif which == EVERYWHERE and self.down:
                everything = self.nodes + self.down
                timelines = self.fixed + [node.timeline for node in self.down]
                found[which] = fit_horizon(everything, timelines, request, multi, now, res)
            elif which == UNCHANGED and self.unchanged is not None:
                found[which] = fit_horizon(self.nodes, self.unchanged, request, multi, now, res)
            elif which == UNHELD and self.project_holds and not request.fractional:
                # Holds take whole GPUs only.
                unheld = self.project_holds.unheld
                found[which] = fit_horizon(self.nodes, unheld, request, multi, now, res)
        return tuple(found) if only is None else found[only]

    def _mig_detail(self, request: Request) -> str:
        """Which GPUs' planned MIG changes hold the request back, and when they happen."""
        wanted = [
            node.devices[bit]
            for node in self.nodes
            for bit in range(len(node.devices))
            if node.need(request.mig_profile, request.device_match) >> bit & 1
        ]
        gpus = {device.parent or device.id for device in wanted}
        lines = [c.detail(self.mig_at[c.gpu]) for c in self.state.mig_changes if c.gpu in gpus]
        return "; ".join(lines) or "a planned MIG layout change holds the devices"

    def never(self, request: Request) -> tuple[str, str]:
        """Reason and detail for a booking no up node can ever hold."""
        everything = self.nodes + self.down
        multi = is_multi_node(request, everything)
        timelines = [NodeTimeline(self.now, node.full) for node in everything]
        if self.down and fits_window(everything, timelines, request, multi, self.now, self.now):
            names = ", ".join(node.name for node in self.down)
            return REASON_NODE_DOWN, f"needs devices on nodes that are down or draining ({names})"
        if self.unchanged is not None:
            # Only the old layout of a changing GPU has such devices: they go away.
            fresh = [NodeTimeline(self.now, node.full) for node in self.nodes]
            end = self.now + request.duration_s
            if fits_window(self.nodes, fresh, request, multi, self.now, end):
                detail = self._mig_detail(request)
                return REASON_MIG_CHANGE, f"{detail}, and only its old layout has such devices"
        short = never_held(request, everything, multi)
        if short is not None:
            return REASON_NEVER, short.never_text()
        return REASON_NEVER, "no devices in the cluster match this request"


# Reasons a booking waits for something other than devices: preempting does not help.
_NOT_BY_DEVICES = {REASON_STARTING, REASON_DEPENDENCY, REASON_QUOTA, REASON_ARRAY_LIMIT}
# Reasons of a booking the devices hold back: a maintenance window may be the one.
_BY_DEVICES = {REASON_PRIORITY, REASON_RESERVATION, REASON_RESOURCES, REASON_NODE_DOWN}


def _copy(timeline: NodeTimeline) -> NodeTimeline:
    return timeline.copy()


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
        # Bookings a limit of cores or memory kept from a start now, with its sentence.
        self.host_blocked: dict[str, str] = {}

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
            reclaiming = run.reclaiming.get(request.booking_id)
            if reclaiming:  # it starts now: the stopped ones' warning is within its grace
                self.starts.append(Start(request.booking_id, run.device_ids(fit)))
                return planned(run.now, fit, REASON_STARTING, f"starts now, {reclaiming}")
            detail = "lower-QOS bookings are being preempted"
            return planned(run.now, fit, REASON_PREEMPTING, detail)
        ledgers = run.quotas.of(request.user, request.project, request.array)
        amount = run.size(request)
        over = run.quotas.over_budget(ledgers, amount * request.duration_s / 3600.0)
        if over:
            return planned(None, None, REASON_QUOTA, over)
        multi = is_multi_node(request, run.nodes)
        drawn = run.project_holds.draw(request, multi, run.now) if run.project_holds else None
        if drawn is not None and not run.project_holds.exempt(
            request.project, drawn.parts, drawn.start, drawn.start + request.duration_s
        ):
            drawn = None  # across back-to-back windows: an ordinary, counted booking
        if drawn is not None and drawn.start == run.now:
            return self._on_hold(request, drawn, planned)
        # A protected booking always holds its reservation, whatever the depth (the bound).
        holds = run.protected(request) and not self.strict
        # A member of a project with holds searches its own view: never skipped on the pass's.
        member = run.project_holds and run.project_holds.finder_for(request.project)
        if not member and not holds and self._skip_estimate(request, multi, ledgers, amount):
            return planned(None, None, *self._explained(request, multi, ledgers, amount))
        fit = self._search(request, multi, ledgers, amount)
        if drawn is not None and (fit is None or drawn.start <= fit.start):
            return self._on_hold(request, drawn, planned)
        if fit is None:
            below = run.quotas.below(ledgers, amount) or self.host_blocked.get(request.booking_id)
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
            self.starts.append(run.start_of(request, fit))
            return planned(fit.start, fit, REASON_STARTING, "starts now")
        reason = self._explained(request, multi, ledgers, amount)
        if run.calendar and reason[0] in _BY_DEVICES:
            reason = run.maintenance(request, multi, fit, reason[0]) or reason
        if waited is not None and could_start:
            wait = run.policy.topology_wait_s
            reason = REASON_TOPOLOGY, f"waits up to {wait:g} s for a better-connected set of GPUs"
        if not holds and self.depth is not None and self.reserved >= self.depth:
            return planned(fit.start, None, *reason)  # estimate only: no devices held
        self.reserved += 1  # a protected booking's reservation counts towards the depth too
        run.reserve(request, fit)
        return planned(fit.start, fit, *reason)

    def _on_hold(self, request: Request, fit: Fit, planned) -> Planned:
        """Plan a member's booking on its project's holds (``holds.HoldViews.draw``): it holds
        the devices whatever the depth (only members compete for them) and is not counted
        against concurrency limits."""
        run = self.run
        run.reserve(request, fit, counted=False)
        if fit.start == run.now:
            self.starts.append(Start(request.booking_id, run.device_ids(fit)))
            return planned(
                fit.start, fit, REASON_STARTING, "starts now on its project's reservation"
            )
        detail = "planned on its project's reservation when the window opens"
        return planned(fit.start, fit, REASON_PROJECT_RESERVATION, detail)

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
        if run.host_start(request, better) != better.start:
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
        # A member searches its project's view: its own holds are free to it. Not a fraction:
        # holds take whole GPUs only, and the views do not carry the shared GPUs' shares.
        holds = run.project_holds and not request.fractional
        finder = run.project_holds.finder_for(request.project) if holds else None
        finder = finder or run.finder
        hosted = bool(run.quotas.host_of(request.user, request.project))
        if not ledgers and not hosted:
            return finder.find(request, multi, t)
        while True:
            if ledgers:
                t = run.quotas.earliest(ledgers, amount, request.duration_s, t)
                if t is None:
                    return None
            fit = finder.find(request, multi, t)
            if fit is not None and fit.start == t and hosted:
                # Its cores and memory on these devices, against its limits of them: where
                # they do not allow this start, search again from the first they allow.
                allowed = run.host_start(request, fit)
                if allowed != t:
                    if t == run.now or allowed is None:
                        self.host_blocked[request.booking_id] = run.host_refusal(request, fit)
                    if allowed is None:
                        return None
                    t = allowed
                    continue
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
        blocked = self.host_blocked.get(request.booking_id)
        if blocked:
            return REASON_QUOTA, blocked
        return run.why(request, multi)
