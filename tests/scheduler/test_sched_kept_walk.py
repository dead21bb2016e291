"""The kept walk: a request not yet queued gets the very line ``plan()`` gives it in the queue."""

from __future__ import annotations

import random
from dataclasses import replace

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sched_factories import MIG_1G, MIG_3G, gpus, mig, shared

from scheduler import Allocation, Policy, Quota, Request, State, plan
from scheduler.kept_walk import keep_walk

DEVICES = (
    gpus("a", 4)
    + gpus("b", 8, model="H100")
    + gpus("c", 8)
    + mig("m", {0: [MIG_3G, MIG_3G], 1: [MIG_1G] * 7})
    + shared("s", 2, memory_mib=40000)
)
USERS = ("u1", "u2", "u3", "u4")
NEWCOMER = "u5"  # holds devices but has nothing queued: the queue has no quota of theirs
PROJECTS = ("p1", "p2", "p3")
NOW = 10_000.0


def _request(draw, bid: str, submit: float) -> Request:
    profile = draw(st.sampled_from([None, None, None, MIG_1G, MIG_3G, "frac"]))
    base = Request(
        bid,
        draw(st.sampled_from(USERS)),
        draw(st.sampled_from(PROJECTS)),
        submit,
        float(draw(st.integers(10, 3000))),
        qos=draw(st.sampled_from(["low", "normal", "normal", "high"])),
    )
    if profile == "frac":  # a fraction of a shared GPU (both None: one whole GPU)
        return replace(
            base,
            gpu_fraction=draw(st.sampled_from([None, 0.25, 0.5, 0.75])),
            gpu_memory_mib=draw(st.sampled_from([None, 10000, 30000])),
        )
    return replace(
        base,
        gpus=1 if profile else draw(st.sampled_from([1, 1, 2, 3, 4, 8, 12, 16])),
        mig_profile=profile,
        gpu_model=draw(st.sampled_from([None, None, "H100"])),
        mixed_models=draw(st.sampled_from([False, False, True])),
    )


@st.composite
def queues(draw):
    """A site with running and advance allocations, quotas and budgets, and a queue."""
    allocations, busy = [], set()
    for i, device in enumerate(DEVICES):
        if draw(st.integers(0, 2)) == 0 and device.id not in busy:
            busy.add(device.id)
            allocations.append(
                Allocation(
                    f"run{i}",
                    (device.id,),
                    0.0,
                    NOW + draw(st.integers(1, 4000)),
                    draw(st.sampled_from(USERS + (NEWCOMER,))),
                    draw(st.sampled_from(PROJECTS)),
                    qos=draw(st.sampled_from(["low", "normal"])),
                    preemptible=draw(st.booleans()),
                    running=True,
                )
            )
    if draw(st.booleans()):
        free = [d.id for d in DEVICES if d.id not in busy][:3]
        allocations.append(
            Allocation("adv", tuple(free), NOW + 500, NOW + 2500, "u1", "p1", running=False)
        )
    count = draw(st.integers(1, 40))
    pending = [_request(draw, f"q{i}", NOW - draw(st.integers(0, 20_000))) for i in range(count)]
    budget = st.sampled_from([None, None, 5.0, 40.0])
    limit = st.sampled_from([None, 2.0, 5.0, 12.0])
    users = {u: Quota(max_gpus=draw(limit), gpu_hours_budget=draw(budget)) for u in USERS[:3]}
    projects = {p: Quota(max_gpus=draw(limit)) for p in PROJECTS[:2]}
    policy = Policy(
        backfill=draw(st.sampled_from(["conservative", "conservative", "easy", "none"])),
        reservation_depth=draw(st.sampled_from([None, None, 3])),
        estimate_all=draw(st.booleans()),
        protect_oldest=draw(st.sampled_from([0, 1, 3])),
        preempt_grace_s=300,
    )
    state = State(
        NOW,
        DEVICES,
        tuple(allocations),
        tuple(pending),
        project_usage={"p1": 5000.0, "p2": 100.0},
        user_quotas=users,
        project_quotas=projects,
    )
    return state, policy


def _line_in_plan(state: State, policy: Policy, request: Request, quotas: dict):
    queued = replace(
        state,
        pending=state.pending + (request,),
        user_quotas={**state.user_quotas, **quotas.get("users", {})},
        project_quotas={**state.project_quotas, **quotas.get("projects", {})},
    )
    return next(line for line in plan(queued, policy).planned if line.booking_id == "0")


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(queues(), st.data(), st.sampled_from([1, 2, 5, 64]))
def test_it_gives_a_new_request_the_line_the_whole_plan_gives_it(queue, data, every):
    state, policy = queue
    kept = keep_walk(state, policy, every=every)
    user = data.draw(st.sampled_from(USERS + (NEWCOMER, NEWCOMER)))
    request = replace(_request(data.draw, "0", NOW), user=user)
    quotas = {}
    if request.user not in state.user_quotas and data.draw(st.booleans()):
        limit = data.draw(st.sampled_from([1.0, 2.0, 4.0]))
        quotas["users"] = {request.user: Quota(max_gpus=limit)}
    line = kept.line(request, user_quotas=quotas.get("users"))
    if line is not None:
        assert line == _line_in_plan(state, policy, request, quotas)


def test_it_answers_most_requests_from_the_kept_walk():
    # A table over random queues: the shortcut must not quietly fall back to a whole plan.
    rng = random.Random(7)
    answered = 0
    for case in range(60):
        state, policy = _random_queue(rng)
        kept = keep_walk(state, policy, every=rng.choice([1, 3, 16]))
        for k in range(5):
            request = Request(
                "0",
                rng.choice(USERS[:3]),
                rng.choice(PROJECTS[:2]),
                NOW,
                float(rng.randrange(10, 3000)),
                gpus=rng.choice([1, 2, 8, 16]),
                qos=rng.choice(["low", "normal"]),
            )
            line = kept.line(request)
            if line is not None:
                answered += 1
                assert line == _line_in_plan(state, policy, request, {}), (case, k)
    assert answered >= 250


def _random_queue(rng: random.Random) -> tuple[State, Policy]:
    allocations = [
        Allocation(f"run{i}", (d.id,), 0.0, NOW + rng.randrange(1, 4000), "u1", "p1", running=True)
        for i, d in enumerate(DEVICES)
        if rng.random() < 0.5
    ]
    pending = tuple(
        Request(
            f"q{i}",
            rng.choice(USERS),
            rng.choice(PROJECTS),
            NOW - rng.randrange(0, 20_000),
            float(rng.randrange(10, 3000)),
            gpus=1 if profile else rng.choice([1, 2, 4, 8, 12]),
            mig_profile=profile,
            qos=rng.choice(["low", "normal", "high"]),
        )
        for i, profile in enumerate(rng.choice([None, None, MIG_1G]) for _ in range(60))
    )
    users = {u: Quota(max_gpus=rng.choice([None, 4.0, 10.0])) for u in USERS}
    projects = {p: Quota(max_gpus=rng.choice([None, 12.0])) for p in PROJECTS}
    state = State(
        NOW,
        DEVICES,
        tuple(allocations),
        pending,
        project_usage={"p1": 5000.0, "p2": 100.0},
        user_quotas=users,
        project_quotas=projects,
    )
    return state, Policy()


def test_it_pauses_between_bookings_when_asked_and_walks_the_same():
    state, policy = _random_queue(random.Random(11))
    pauses = []
    paused = keep_walk(state, policy, every=8, pause=lambda: pauses.append(1))
    plain = keep_walk(state, policy, every=8)
    request = Request("0", "u1", "p1", NOW, 600.0, gpus=2)
    assert len(pauses) == len(state.pending) // 16 + 1  # every 16 bookings, from the first
    assert paused.line(request) == plain.line(request) == _line_in_plan(state, policy, request, {})
