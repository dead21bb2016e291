"""Property: no plan double-books a device or exceeds a concurrency quota, at any time; no shared
GPU holds more than 1.0 of compute or more than its memory, or a whole booking beside fractions;
no booking it plans crosses a maintenance window on its nodes, or a GPU's slices across its
planned MIG layout change; borrowing takes no start from a booking within its limits and stays
within max_borrow_gpus."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sched_factories import MIG_1G, MIG_3G, gpus, mig, shared

from scheduler import Allocation, NodeResources, Policy, Quota, Request, State, node_demand, plan
from scheduler.mig_layout import MigChange, change_times
from scheduler.sharing import share_on
from scheduler.types import NODE_MAINTENANCE, ProjectHold, Window

DEVICES = (
    gpus("a", 4)
    + gpus("b", 8, model="H100")
    + mig("m", {0: [MIG_3G, MIG_3G], 1: [MIG_1G] * 7})
    + shared("s", 2, memory_mib=40000)
    + gpus("s", 1)
)
BY_ID = {device.id: device for device in DEVICES}
FRACTION = {device.id: device.fraction for device in DEVICES}
NODE_OF = {device.id: device.node for device in DEVICES}
USERS = ("u1", "u2", "u3")
PROJECTS = ("p1", "p2")


@st.composite
def scenarios(draw):
    now = 1000.0
    allocations, busy = [], set()
    for i, device in enumerate(DEVICES):
        if device.shared:
            for k in range(draw(st.integers(0, 2))):
                share = draw(st.sampled_from([0.25, 0.5]))
                allocations.append(
                    Allocation(
                        f"run{i}-{k}",
                        (device.id,),
                        0.0,
                        now + draw(st.integers(1, 500)),
                        draw(st.sampled_from(USERS)),
                        draw(st.sampled_from(PROJECTS)),
                        qos=draw(st.sampled_from(["low", "normal"])),
                        preemptible=draw(st.booleans()),
                        share=share,
                        gpu_memory_mib=int(share * device.memory_mib),
                    )
                )
            continue
        if draw(st.integers(0, 3)) == 0 and device.id not in busy:
            busy.add(device.id)
            allocations.append(
                Allocation(
                    f"run{i}",
                    (device.id,),
                    0.0,
                    now + draw(st.integers(1, 500)),
                    draw(st.sampled_from(USERS)),
                    draw(st.sampled_from(PROJECTS)),
                    qos=draw(st.sampled_from(["low", "normal"])),
                    preemptible=draw(st.booleans()),
                    running=True,
                    borrowed=draw(st.integers(0, 4)) == 0,
                )
            )
    if draw(st.booleans()):
        free = [d.id for d in DEVICES if d.id not in busy and not d.shared][:2]
        allocations.append(
            Allocation("adv", tuple(free), now + 50, now + 400, "u1", "p1", running=False)
        )
    pending = []
    for i in range(draw(st.integers(1, 14))):
        profile = draw(st.sampled_from([None, None, None, MIG_1G, MIG_3G, "frac", "frac"]))
        if profile == "frac":
            fraction = draw(st.sampled_from([None, 0.1, 0.25, 0.5, 0.75]))
            memory = draw(
                st.sampled_from([None, 5000, 20000, 40000]) if fraction else st.just(10000)
            )
            pending.append(
                Request(
                    f"q{i}",
                    draw(st.sampled_from(USERS)),
                    draw(st.sampled_from(PROJECTS)),
                    now - draw(st.integers(0, 2000)),
                    float(draw(st.integers(10, 600))),
                    qos=draw(st.sampled_from(["low", "normal", "high"])),
                    preemptible=draw(st.booleans()),
                    gpu_fraction=fraction,
                    gpu_memory_mib=memory,
                )
            )
            continue
        pending.append(
            Request(
                f"q{i}",
                draw(st.sampled_from(USERS)),
                draw(st.sampled_from(PROJECTS)),
                now - draw(st.integers(0, 2000)),
                float(draw(st.integers(10, 600))),
                gpus=1 if profile else draw(st.sampled_from([1, 2, 3, 4, 8, 12])),
                mig_profile=profile,
                gpu_model=draw(st.sampled_from([None, None, "H100"])),
                qos=draw(st.sampled_from(["low", "normal", "high"])),
            )
        )
    quotas = {u: _quota(draw, [None, 2.0, 5.0, 12.0]) for u in USERS}
    projects = {p: _quota(draw, [None, 3.0, 9.0]) for p in PROJECTS}
    backfill = draw(st.sampled_from(["conservative", "easy", "none"]))
    windows = []
    for i in range(draw(st.integers(0, 2))):
        start = now + draw(st.integers(-200, 700))
        nodes = draw(st.lists(st.sampled_from(["a", "b", "m", "s"]), min_size=1, max_size=4))
        end = start + draw(st.integers(1, 400))
        windows.append(Window(f"w{i}", "maintenance", start, end, tuple(sorted(set(nodes)))))
    devices = DEVICES
    if draw(st.integers(0, 4)) == 0:  # node b drained for a window under way
        devices = tuple(
            replace(d, node_state=NODE_MAINTENANCE) if d.node == "b" else d for d in DEVICES
        )
        windows.append(Window("drained", "maintenance", now - 100, now + 300, ("b",)))
    changing = draw(st.sampled_from([(), (), ("m-g0",), ("m-g1",), ("m-g0", "m-g1")]))
    whole = [d.id for d in DEVICES if d.profile is None and not d.shared]
    holds = tuple(
        ProjectHold(
            f"h{i}",
            draw(st.sampled_from(PROJECTS)),
            start := now + draw(st.integers(-100, 400)),
            start + draw(st.integers(50, 600)),
            tuple(draw(st.lists(st.sampled_from(whole), min_size=1, max_size=8, unique=True))),
        )
        for i in range(draw(st.integers(0, 2)))
    )
    return State(
        now,
        devices,
        tuple(allocations),
        tuple(pending),
        user_quotas=quotas,
        project_quotas=projects,
        windows=tuple(windows),
        mig_changes=tuple(MigChange(gpu) for gpu in changing),
        holds=holds,
    ), Policy(
        backfill=backfill, preempt_grace_s=300, reclaim_grace_s=draw(st.sampled_from([0, 300]))
    )


def _quota(draw, limits) -> Quota:
    """A concurrency limit that may lend (borrowing on, with or without max_borrow_gpus)."""
    borrowing = draw(st.booleans())
    most = draw(st.sampled_from([None, 1.0, 4.0])) if borrowing else None
    return Quota(max_gpus=draw(st.sampled_from(limits)), borrowing=borrowing, max_borrow_gpus=most)


def _without_borrowing(state):
    off = {name: replace(quota, borrowing=False) for name, quota in state.user_quotas.items()}
    projects = {name: replace(q, borrowing=False) for name, q in state.project_quotas.items()}
    return replace(state, user_quotas=off, project_quotas=projects)


def _borrowed(state, result):
    """Ids of the allocations and starts that are borrowed."""
    running = {a.booking_id for a in state.allocations if a.borrowed}
    return running | {s.booking_id for s in result.starts if s.borrowed}


def _on_own_hold(state, hold) -> bool:
    """A planned (device, start, end, user, project, booking) drawn on its project's hold."""
    device, start, end, _, project = hold[:5]
    return any(
        h.project == project and device in h.device_ids and h.start <= start and end <= h.end
        for h in state.holds
    )


def _holds(state, result):
    """(device, start, end, user, project, booking, share, memory) for everything the plan holds
    devices for (share 1 and memory None: the whole device)."""
    preempted = {p.booking_id for p in result.preemptions}
    out = [
        (d, max(a.start, state.now), a.end, a.user, a.project, a.booking_id)
        + ((a.share, a.gpu_memory_mib) if a.share < 1 else (FRACTION[d], None))
        for a in state.allocations
        if a.booking_id not in preempted
        for d in a.device_ids
    ]
    requests = {r.booking_id: r for r in state.pending}
    for line in result.planned:
        r = requests[line.booking_id]
        for d in line.device_ids:
            held = share_on(r, BY_ID[d]) if r.fractional else (FRACTION[d], None)
            out.append((d, line.start, line.start + r.duration_s, r.user, r.project, r.booking_id))
            out[-1] += held
    return out


def _check_shared(holds):
    """A shared GPU holds fractions only, within its compute and memory; an exclusive GPU no
    fraction."""
    for device_id in {hold[0] for hold in holds}:
        mine = [hold for hold in holds if hold[0] == device_id]
        if not BY_ID[device_id].shared:
            assert all(hold[7] is None for hold in mine), device_id
            continue
        assert all(hold[7] is not None for hold in mine), device_id
        for t in sorted({hold[1] for hold in mine}):
            live = [hold for hold in mine if hold[1] <= t < hold[2]]
            assert sum(hold[6] for hold in live) <= 1.0 + 1e-9, (device_id, t)
            assert sum(hold[7] for hold in live) <= BY_ID[device_id].memory_mib, (device_id, t)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_it_never_double_books_a_device_or_exceeds_a_quota(scenario):
    state, policy = scenario
    result = plan(state, policy)
    assert sorted(line.booking_id for line in result.planned) == sorted(
        r.booking_id for r in state.pending
    )
    holds = _holds(state, result)
    by_device: dict[str, list] = {}
    for hold in holds:
        by_device.setdefault(hold[0], []).append(hold[1:3])
    for device_id, spans in by_device.items():
        if BY_ID[device_id].shared:
            continue  # fractions share it: _check_shared bounds them
        spans.sort()
        assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:], strict=False))
    _check_shared(holds)
    started = {s.booking_id for s in result.starts}
    fixed_ids = {a.booking_id for a in state.allocations}
    borrowed = _borrowed(state, result)
    within = [h for h in holds if h[5] not in borrowed]
    lent = [h for h in holds if h[5] in borrowed]
    for kind, limits, index, field in (
        ("user", state.user_quotas, 3, "max_gpus"),
        ("project", state.project_quotas, 4, "max_gpus"),
        ("user", state.user_quotas, 3, "max_borrow_gpus"),
        ("project", state.project_quotas, 4, "max_borrow_gpus"),
    ):
        for name, quota in limits.items():
            limit = getattr(quota, field)
            if limit is None or (field == "max_borrow_gpus" and not quota.borrowing):
                continue
            mine = [h for h in (within if field == "max_gpus" else lent) if h[index] == name]
            for t in sorted({h[1] for h in mine}):
                # A booking (planned or live) wholly on its project's holds is not counted.
                drawn = {
                    h[5] for h in mine if all(_on_own_hold(state, g) for g in mine if g[5] == h[5])
                }
                live = [h for h in mine if h[1] <= t < h[2] and h[5] not in drawn]
                used = sum(h[6] for h in live)
                new = sum(h[6] for h in live if h[5] not in fixed_ids)
                before = used - new
                # Only what the plan adds is bounded: fixed use may already be over a lowered limit.
                if new:
                    assert used <= limit + 1e-9, (kind, name, field, t)
                else:
                    assert before == used
    assert started <= {line.booking_id for line in result.planned if line.start == state.now}
    # No booking the plan places overlaps a maintenance window on its nodes.
    placed = [h for h in holds if h[5] not in fixed_ids]
    for window in state.windows:
        for device, start, end, *_ in placed:
            if NODE_OF[device] in window.nodes:
                assert end <= window.start or start >= window.end, (device, window)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_it_never_gives_an_outsider_reserved_capacity_across_its_window(scenario):
    state, policy = scenario
    result = plan(state, policy)
    requests = {r.booking_id: r for r in state.pending}
    for line in result.planned:
        request = requests[line.booking_id]
        end = line.start + request.duration_s if line.start is not None else None
        for hold in state.holds:
            if hold.project == request.project or hold.end <= state.now:
                continue
            if set(line.device_ids) & set(hold.device_ids):
                assert end <= max(hold.start, state.now) or line.start >= hold.end, (line, hold)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_it_starts_no_borrowed_booking_where_one_within_its_limits_could_start(scenario):
    # Borrowing comes after the walk: every booking within its limits starts (or holds its
    # devices) as it would with borrowing off, and only bookings whose quota lends borrow.
    state, policy = scenario
    result, plain = plan(state, policy), plan(_without_borrowing(state), policy)
    assert tuple(s for s in result.starts if not s.borrowed) == plain.starts
    assert result.preemptions == plain.preemptions
    lines = {line.booking_id: line for line in result.planned}
    for line in plain.planned:
        if line.booking_id not in {s.booking_id for s in result.starts if s.borrowed}:
            assert lines[line.booking_id] == line
    requests = {r.booking_id: r for r in state.pending}
    for start in result.starts:
        if start.borrowed:
            r = requests[start.booking_id]
            lenders = {f"user {r.user}", f"project {r.project}"}
            assert set(start.borrowed_past) <= lenders
            for label in start.borrowed_past:
                kind, name = label.split(" ")
                assert (state.user_quotas if kind == "user" else state.project_quotas)[
                    name
                ].borrowing


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_it_starts_and_preempts_the_same_when_asked_for_the_starts_only(scenario):
    # The replay's shortcut: the walk stops once no device is free now.
    state, policy = scenario
    full, quick = plan(state, policy), plan(state, policy, starts_only=True)
    assert quick.starts == full.starts
    assert quick.preemptions == full.preemptions
    assert quick.planned == full.planned[: len(quick.planned)]


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios(), st.data())
def test_it_plans_a_booking_the_same_when_the_walk_stops_at_it(scenario, data):
    # The estimate's shortcut: the walk stops once its hypothetical booking is planned (and
    # gives no estimate to the bookings before it past the depth: they hold nothing).
    state, policy = scenario
    if not state.pending:
        return
    target = data.draw(st.sampled_from([r.booking_id for r in state.pending]))
    # Only the target may borrow then: where the whole pass starts it borrowed, so does this.
    lent = plan(state, policy, until=target)
    if any(s.booking_id == target for s in plan(state, policy).starts if s.borrowed):
        assert lent.starts[-1].booking_id == target and lent.starts[-1].borrowed
    state = _without_borrowing(state)
    full, quick = plan(state, policy), plan(state, policy, until=target)
    assert quick.planned[-1] == next(p for p in full.planned if p.booking_id == target)
    walked = [p.booking_id for p in full.planned[: len(quick.planned)]]
    assert [p.booking_id for p in quick.planned] == walked
    assert quick.starts == tuple(s for s in full.starts if s.booking_id in walked)


PARENT = {device.id: device.parent for device in DEVICES}


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_it_never_plans_a_booking_across_a_planned_mig_change(scenario):
    state, policy = scenario
    at = change_times(state)
    result = plan(state, policy)
    fixed_ids = {a.booking_id for a in state.allocations}
    for device, start, end, *_, booking in _holds(state, result):
        change = at.get(PARENT.get(device, ""))
        if change is None or booking in fixed_ids:
            continue
        assert end <= change or start >= change, (booking, device, start, end, change)
        # Its slices go away at the change: nothing is planned on them after it either.
        assert start < change, (booking, device, start, change)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios(), st.data())
def test_it_never_keeps_a_booking_within_its_limits_waiting_past_the_grace_for_borrowed_work(
    scenario, data
):
    # One booking within its limits (no quota), of one node, that has waited its grace less
    # the warning: if it would fit now were the borrowed runs gone, it starts now (reclaiming)
    # or its planned start is within its grace.
    state, policy = scenario
    request = data.draw(st.sampled_from(state.pending))
    if request.gpus > 8:
        return
    policy = replace(
        policy, reclaim_warning_s=data.draw(st.sampled_from([0.0, policy.reclaim_grace_s]))
    )
    waited = policy.reclaim_grace_s - policy.reclaim_warning_s + data.draw(st.integers(0, 100))
    request = replace(request, user="free", project="free", submit_time=state.now - waited)
    alone = replace(state, pending=(request,))
    unborrowed = replace(alone, allocations=tuple(a for a in state.allocations if not a.borrowed))
    if not plan(unborrowed, policy).starts:
        return  # something other than borrowed work holds it back
    result = plan(alone, policy)
    (line,) = result.planned
    assert line.start is not None
    assert line.start <= max(state.now, request.submit_time + policy.reclaim_grace_s), line
    if line.start == state.now and line.reason == "starting":
        assert [s.booking_id for s in result.starts] == [request.booking_id]


@st.composite
def resourced(draw):
    """A scenario with cores and memory on every node and on some bookings (issue 40)."""
    state, policy = draw(scenarios())
    nodes = sorted({d.node for d in state.devices})
    capacity = {
        n: NodeResources(draw(st.integers(4, 32)), draw(st.integers(8, 64)) * 1024, 4)
        for n in nodes
    }
    asked = st.one_of(st.none(), st.integers(1, 12))
    memory = st.one_of(st.none(), st.integers(1, 24).map(lambda g: g * 1024))
    pending = tuple(replace(r, cpus=draw(asked), memory_mib=draw(memory)) for r in state.pending)
    return replace(state, pending=pending, node_resources=capacity), policy


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(resourced())
def test_it_never_over_commits_the_cores_or_memory_of_a_node(scenario):
    state, policy = scenario
    result = plan(state, policy)
    requests = {r.booking_id: r for r in state.pending}
    spans = []  # (node, start, end, cpus, memory) of what the plan adds (whole GPUs, MIG)
    for line in result.planned:
        request = requests[line.booking_id]
        if line.start is None or not line.device_ids or request.fractional:
            continue
        per_node: dict[str, float] = {}
        for device_id in line.device_ids:
            per_node[NODE_OF[device_id]] = per_node.get(NODE_OF[device_id], 0.0) + (
                BY_ID[device_id].fraction
            )
        for node, eq in per_node.items():
            held = node_demand(
                request.cpus, request.memory_mib, round(eq, 9), state.node_resources[node], policy
            )
            spans.append((node, line.start, line.start + request.duration_s, *held))
    for node, capacity in state.node_resources.items():
        mine = [s for s in spans if s[0] == node]
        for t in {s[1] for s in mine}:
            live = [s for s in mine if s[1] <= t < s[2]]
            assert sum(s[3] for s in live) <= capacity.cpus, (node, t)
            assert sum(s[4] for s in live) <= capacity.memory_mib, (node, t)


def _held_by_node(device_ids, share: float = 1.0) -> dict[str, float]:
    """GPU-equivalents on each node of these devices (a fraction: its share)."""
    per_node: dict[str, float] = {}
    for device_id in device_ids:
        held = share if share < 1.0 else BY_ID[device_id].fraction
        per_node[NODE_OF[device_id]] = per_node.get(NODE_OF[device_id], 0.0) + held
    return per_node


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(resourced(), st.integers(4, 40), st.integers(8, 96))
def test_it_never_plans_a_project_past_its_limits_of_cores_and_memory(scenario, cores, gib):
    # Every project limited to ``cores`` and ``gib`` GiB at once; no holds (they exempt).
    state, policy = scenario
    limits = {"max_cpus": cores, "max_memory_mib": gib * 1024}
    projects = {r.project for r in state.pending} | {a.project for a in state.allocations}
    quotas = {p: replace(state.project_quotas.get(p, Quota()), **limits) for p in projects}
    state = replace(state, project_quotas=quotas, holds=())
    result = plan(state, policy)
    requests = {r.booking_id: r for r in state.pending}
    live = [(a, a.start, a.end, _held_by_node(a.device_ids, a.share)) for a in state.allocations]
    planned = [
        (
            requests[line.booking_id],
            line.start,
            line.start + requests[line.booking_id].duration_s,
            _held_by_node(line.device_ids),
        )
        for line in result.planned
        if line.start is not None and line.device_ids and not requests[line.booking_id].fractional
    ]

    def held(item) -> tuple[int, int]:
        booking, _, _, per_node = item
        cpus = memory = 0
        for node, eq in per_node.items():
            c, m = node_demand(
                booking.cpus, booking.memory_mib, round(eq, 9), state.node_resources[node], policy
            )
            cpus, memory = cpus + c, memory + m
        return cpus, memory

    for project in projects:
        mine = [p for p in planned if p[0].project == project]
        theirs = mine + [a for a in live if a[0].project == project]
        for t in {p[1] for p in mine}:
            at = [held(item) for item in theirs if item[1] <= t < item[2]]
            assert sum(c for c, _ in at) <= cores, (project, t)
            assert sum(m for _, m in at) <= gib * 1024, (project, t)
