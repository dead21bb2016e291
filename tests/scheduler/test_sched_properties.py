"""Property: no plan double-books a device or exceeds a concurrency quota, at any time."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sched_factories import MIG_1G, MIG_3G, gpus, mig

from scheduler import Allocation, Policy, Quota, Request, State, plan

DEVICES = (
    gpus("a", 4) + gpus("b", 8, model="H100") + mig("m", {0: [MIG_3G, MIG_3G], 1: [MIG_1G] * 7})
)
FRACTION = {device.id: device.fraction for device in DEVICES}
USERS = ("u1", "u2", "u3")
PROJECTS = ("p1", "p2")


@st.composite
def scenarios(draw):
    now = 1000.0
    allocations, busy = [], set()
    for i, device in enumerate(DEVICES):
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
                )
            )
    if draw(st.booleans()):
        free = [d.id for d in DEVICES if d.id not in busy][:2]
        allocations.append(
            Allocation("adv", tuple(free), now + 50, now + 400, "u1", "p1", running=False)
        )
    pending = []
    for i in range(draw(st.integers(1, 14))):
        profile = draw(st.sampled_from([None, None, None, MIG_1G, MIG_3G]))
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
    quotas = {u: Quota(max_gpus=draw(st.sampled_from([None, 2.0, 5.0, 12.0]))) for u in USERS}
    projects = {p: Quota(max_gpus=draw(st.sampled_from([None, 3.0, 9.0]))) for p in PROJECTS}
    backfill = draw(st.sampled_from(["conservative", "easy", "none"]))
    return State(
        now,
        DEVICES,
        tuple(allocations),
        tuple(pending),
        user_quotas=quotas,
        project_quotas=projects,
    ), Policy(backfill=backfill, preempt_grace_s=300)


def _holds(state, result):
    """(device, start, end, user, project, booking) for everything the plan holds devices for."""
    preempted = {p.booking_id for p in result.preemptions}
    out = [
        (d, max(a.start, state.now), a.end, a.user, a.project, a.booking_id)
        for a in state.allocations
        if a.booking_id not in preempted
        for d in a.device_ids
    ]
    requests = {r.booking_id: r for r in state.pending}
    for line in result.planned:
        r = requests[line.booking_id]
        out += [
            (d, line.start, line.start + r.duration_s, r.user, r.project, r.booking_id)
            for d in line.device_ids
        ]
    return out


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
    for spans in by_device.values():
        spans.sort()
        assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:], strict=False))
    started = {s.booking_id for s in result.starts}
    fixed_ids = {a.booking_id for a in state.allocations}
    for kind, limits, index in (
        ("user", state.user_quotas, 3),
        ("project", state.project_quotas, 4),
    ):
        for name, quota in limits.items():
            if quota.max_gpus is None:
                continue
            mine = [h for h in holds if h[index] == name]
            for t in sorted({h[1] for h in mine}):
                live = [h for h in mine if h[1] <= t < h[2]]
                used = sum(FRACTION[h[0]] for h in live)
                new = sum(FRACTION[h[0]] for h in live if h[5] not in fixed_ids)
                before = used - new
                # Only what the plan adds is bounded: fixed use may already be over a lowered limit.
                if new:
                    assert used <= quota.max_gpus + 1e-9, (kind, name, t)
                else:
                    assert before == used
    assert started <= {line.booking_id for line in result.planned if line.start == state.now}


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
    full, quick = plan(state, policy), plan(state, policy, until=target)
    assert quick.planned[-1] == next(p for p in full.planned if p.booking_id == target)
    walked = [p.booking_id for p in full.planned[: len(quick.planned)]]
    assert [p.booking_id for p in quick.planned] == walked
    assert quick.starts == tuple(s for s in full.starts if s.booking_id in walked)
