"""Allocator rules: backfill, priority, starvation, quotas, preemption, reasons and positions."""

from __future__ import annotations

import pytest
from sched_factories import FIFO_ORDER, MIG_3G, MULTIFACTOR, alloc, by_id, gpus, mig, req, state

from scheduler import Policy, Quota, decay_usage, never_fits, plan
from scheduler.priority import priority_of, site_scales
from scheduler.replay import Job, Replay

NODE = gpus("a")
SIX_BUSY = [alloc("run", [f"a-g{i}" for i in range(6)], 100)]


@pytest.mark.parametrize(
    ("candidate", "starts_now"),
    [
        (req("short", 2, duration=100, submit=1), True),  # ends before the head's start
        (req("long-fits", 2, duration=500, submit=1), True),  # leaves 6 GPUs for the head at 100
        (req("long-blocks", 2, duration=500, submit=1), True),
        (req("too-long", 4, duration=500, submit=1), False),  # would hold 4 of the head's GPUs
    ],
)
def test_it_backfills_only_what_does_not_delay_the_higher_priority_booking(candidate, starts_now):
    head = req("head", 6, duration=300, submit=0)
    alone = by_id(plan(state(NODE, [head], SIX_BUSY), FIFO_ORDER))["head"]
    result = plan(state(NODE, [head, candidate], SIX_BUSY), FIFO_ORDER)
    lines = by_id(result)
    assert lines["head"].start == alone.start == 100
    assert (candidate.booking_id in {s.booking_id for s in result.starts}) is starts_now
    if not starts_now:
        assert lines[candidate.booking_id].start >= 100 + 300 or lines[candidate.booking_id].reason


def test_it_plans_every_booking_with_non_overlapping_reservations():
    pending = [req(f"r{i}", gpus=1 + i % 4, duration=50 + 37 * i, submit=i) for i in range(12)]
    result = plan(state(NODE, pending, SIX_BUSY), Policy())
    assert sorted(line.booking_id for line in result.planned) == sorted(
        r.booking_id for r in pending
    )
    assert [line.position for line in result.planned] == list(range(1, 13))
    duration = {r.booking_id: r.duration_s for r in pending}
    held = {f"a-g{i}": [(0, 100)] for i in range(6)}
    for line in result.planned:
        for device in line.device_ids:
            held.setdefault(device, []).append((line.start, line.start + duration[line.booking_id]))
    for spans in held.values():
        spans.sort()
        assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:], strict=False))


@pytest.mark.parametrize(
    ("backfill", "small_starts"),
    [("conservative", True), ("easy", True), ("none", False)],
)
def test_it_backfills_according_to_the_policy(backfill, small_starts):
    pending = [req("head", 8, duration=300, submit=0), req("small", 1, duration=50, submit=1)]
    result = plan(state(NODE, pending, SIX_BUSY), Policy(backfill=backfill, weight_size=0))
    assert ("small" in {s.booking_id for s in result.starts}) is small_starts
    assert by_id(result)["head"].start == 100


def _replay_stream(policy: Policy) -> float:
    """An 8-GPU job submitted into a steady stream of 1-GPU jobs; returns its wait."""
    jobs = [Job("big", "u", "p", 50.0, 1000.0, 1000.0, 8)]
    jobs += [Job(f"s{i:04d}", "u", "p", 100.0 * i, 900.0, 900.0, 1) for i in range(1500)]
    jobs.sort(key=lambda job: job.submit)
    replay = Replay(jobs, gpus("a"), policy)
    replay.run()
    return replay.started["big"] - 50.0


# No protection, in the multifactor priority order these tests are about.
UNPROTECTED = dict(protect_oldest=0, protect_after_runs=None, **MULTIFACTOR)


def test_it_eventually_starts_an_old_big_job_in_a_stream_of_small_ones():
    fair = Policy(age_max_s=20_000.0, **UNPROTECTED)
    assert _replay_stream(fair) <= 20_000.0 + 1000.0
    # No age factor and no protection: small ones win forever.
    greedy = Policy(weight_age=0.0, age_max_s=20_000.0, **UNPROTECTED)
    assert _replay_stream(greedy) > 100_000.0
    # The oldest booking's reservation alone bounds the wait: no priority factor needed.
    assert _replay_stream(Policy(weight_age=0.0, age_max_s=20_000.0, **MULTIFACTOR)) <= 1000.0


def test_it_ranks_by_the_priority_factors():
    old = req("old", 8, duration=3600, submit=0)
    young_small = req("young", 1, duration=60, submit=3000)
    high = req("high", 8, duration=3600, submit=3000, qos="high")
    result = plan(
        state(NODE, [old, young_small, high], SIX_BUSY, now=3600.0),
        Policy(age_max_s=3600, **UNPROTECTED),
    )
    lines = by_id(result)
    assert lines["high"].position == 1
    assert lines["old"].priority.age == Policy().weight_age
    assert lines["young"].priority.size > lines["old"].priority.size
    total = lines["high"].priority
    assert total.total == pytest.approx(total.age + total.fairshare + total.size + total.qos)


def test_it_favours_projects_that_used_less_than_their_share():
    usage = decay_usage([("heavy", 0, 3600, 8)], now=3600, half_life_s=86400)
    pending = [req("h", project="heavy", submit=0), req("l", project="light", submit=10)]
    result = plan(
        state(
            NODE,
            pending,
            [alloc("run", [f"a-g{i}" for i in range(8)], 500)],
            now=3600,
            project_shares={"heavy": 1, "light": 1},
            project_usage=usage,
        ),
        Policy(**UNPROTECTED),
    )
    lines = by_id(result)
    assert (
        lines["l"].position == 1 and lines["l"].priority.fairshare > lines["h"].priority.fairshare
    )


def test_it_decays_usage_by_the_half_life():
    recent = decay_usage([("p", 99, 100, 1.0)], now=100, half_life_s=50)["p"]
    old = decay_usage([("p", 49, 50, 1.0)], now=100, half_life_s=50)["p"]
    assert old == pytest.approx(recent / 2, rel=1e-3)
    assert decay_usage([("p", 200, 300, 1.0)], now=100, half_life_s=50) == {}


# fmt: off
QUOTA_CASES = [
    # (name, devices, running, pending, user quotas, project quotas, expected reason, detail word)
    ("user limit", NODE, [alloc("r", ["a-g0", "a-g1"], 500, user="u", project="q")],
     req("x", 1), {"u": Quota(max_gpus=2)}, {}, "quota", "user u"),
    ("project limit", NODE, [alloc("r", ["a-g0", "a-g1"], 500, user="v", project="p")],
     req("x", 2), {}, {"p": Quota(max_gpus=3)}, "quota", "project p"),
    ("MIG fits as 6/7", mig("m", {0: [MIG_3G, MIG_3G]}),
     [alloc("r", ["m-g0-0"], 500, user="u", project="p")],
     req("x", mig_profile=MIG_3G), {}, {"p": Quota(max_gpus=1)}, "starting", "starts"),
    ("MIG over as 9/7", mig("m", {0: [MIG_3G, MIG_3G], 1: [MIG_3G]}),
     [alloc("r", ["m-g0-0", "m-g0-1"], 500, user="u", project="p")],
     req("x", mig_profile=MIG_3G), {}, {"p": Quota(max_gpus=1)}, "quota", "project p"),
    ("budget", NODE, [], req("x", 2, duration=3600), {},
     {"p": Quota(gpu_hours_budget=10, gpu_hours_used=9)}, "quota", "budget"),
]
# fmt: on


@pytest.mark.parametrize(
    ("name", "devices", "running", "pending", "users", "projects", "reason", "word"), QUOTA_CASES
)
def test_it_holds_bookings_back_by_quota(
    name, devices, running, pending, users, projects, reason, word
):
    result = plan(
        state(devices, [pending], running, user_quotas=users, project_quotas=projects), Policy()
    )
    line = by_id(result)["x"]
    assert line.reason == reason, name
    assert word in line.detail
    if reason == "quota" and "budget" not in word:
        assert line.start == 500  # planned for when the owner's own use ends


def test_it_counts_starts_of_the_same_pass_against_the_quota():
    pending = [req(f"x{i}", 1, submit=i) for i in range(4)]
    result = plan(state(NODE, pending, user_quotas={"u": Quota(max_gpus=3)}), Policy())
    assert len(result.starts) == 3
    assert by_id(result)["x3"].reason == "quota" and by_id(result)["x3"].start == 100


def _preempt_case(victims, pending, now=1000.0, policy=None):
    return plan(
        state(gpus("a", 4), pending, victims, now=now), policy or Policy(preempt_grace_s=300)
    )


def test_it_preempts_the_fewest_and_lowest_qos_bookings():
    victims = [
        alloc("low1", ["a-g0"], 9000, qos="low", preemptible=True),
        alloc("norm2", ["a-g1", "a-g2"], 9000, qos="normal", preemptible=True),
        alloc("low3", ["a-g3"], 9000, qos="low", preemptible=True),
    ]
    result = _preempt_case(victims, [req("vip", 2, qos="high", submit=0)])
    assert {(p.booking_id, p.for_booking_id) for p in result.preemptions} == {
        ("low1", "vip"),
        ("low3", "vip"),
    }
    line = by_id(result)["vip"]
    assert (
        line.reason == "preempting"
        and line.start == 1000
        and set(line.device_ids) == {"a-g0", "a-g3"}
    )
    assert result.starts == ()
    result = _preempt_case(victims, [req("vip", 3, qos="high", submit=0)])
    assert len(result.preemptions) == 2 and {p.booking_id for p in result.preemptions} & {"norm2"}


@pytest.mark.parametrize(
    ("victim", "submit", "preempted"),
    [
        (alloc("v", ["a-g0", "a-g1", "a-g2", "a-g3"], 9000, qos="low", preemptible=True), 0, True),
        (
            alloc("v", ["a-g0", "a-g1", "a-g2", "a-g3"], 9000, qos="low", preemptible=True),
            900,
            False,
        ),
        (
            alloc("v", ["a-g0", "a-g1", "a-g2", "a-g3"], 9000, qos="low", preemptible=False),
            0,
            False,
        ),
        (
            alloc("v", ["a-g0", "a-g1", "a-g2", "a-g3"], 9000, qos="high", preemptible=True),
            0,
            False,
        ),
    ],
    ids=["after grace", "within grace", "not preemptible", "same qos"],
)
def test_it_preempts_only_after_the_grace_period_and_only_what_it_may(victim, submit, preempted):
    result = _preempt_case([victim], [req("vip", 1, qos="high", submit=submit)])
    assert bool(result.preemptions) is preempted
    within_grace = submit == 900 and victim.preemptible and victim.qos == "low"
    reason = "preempting" if preempted or within_grace else "resources"
    assert by_id(result)["vip"].reason == reason


def test_it_says_whom_and_when_a_booking_in_its_grace_period_will_preempt():
    victims = [
        alloc("12", ["a-g0", "a-g1"], 9000, qos="low", preemptible=True),
        alloc("13", ["a-g2", "a-g3"], 9000, qos="low", preemptible=True),
    ]
    # Submitted at 900: its 300 s of grace end at 1200 (00:20 UTC on the epoch's first day).
    one = by_id(_preempt_case(victims, [req("vip", 1, qos="high", submit=900)]))["vip"]
    # Its line keeps the start it holds devices for (when the victims end: a bound), not 1200.
    assert (one.reason, one.start) == ("preempting", 9000.0)
    assert one.detail == "will preempt booking 12 at 1970-01-01 00:20 UTC"
    both = by_id(_preempt_case(victims, [req("vip", 3, qos="high", submit=900)]))["vip"]
    assert both.detail == "will preempt bookings 12, 13 at 1970-01-01 00:20 UTC"
    # Devices that free up before the grace ends: it starts then, preempting nobody.
    short = [alloc("12", ["a-g0", "a-g1", "a-g2", "a-g3"], 1100, qos="low", preemptible=True)]
    line = by_id(_preempt_case(short, [req("vip", 1, qos="high", submit=900)]))["vip"]
    assert (line.reason, line.start) == ("resources", 1100)


def _whole_node_case(victims, gpus_asked=8):
    devices = gpus("a", 4) + gpus("b", 4) + gpus("c", 4)
    pending = [req("vip", gpus_asked, qos="high", submit=0)]
    return plan(state(devices, pending, victims, now=1000.0), Policy(preempt_grace_s=300))


def test_it_clears_whole_nodes_for_a_larger_request_taking_the_cheapest_nodes():
    victims = [
        alloc("low-a", ["a-g0"], 9000, qos="low", preemptible=True),
        alloc("norm-b", ["b-g0", "b-g1"], 9000, qos="normal", preemptible=True),
        alloc("low-c1", ["c-g0"], 9000, qos="low", preemptible=True),
        alloc("low-c2", ["c-g1"], 9000, qos="low", preemptible=True),
    ]
    result = _whole_node_case(victims)
    # Nodes a (one low victim) and c (two low victims) beat b (a normal-QOS victim).
    assert {p.booking_id for p in result.preemptions} == {"low-a", "low-c1", "low-c2"}
    line = by_id(result)["vip"]
    assert line.reason == "preempting" and line.start == 1000
    assert {d.split("-")[0] for d in line.device_ids} == {"a", "c"} and len(line.device_ids) == 8


def test_it_never_clears_a_node_holding_work_it_may_not_preempt():
    victims = [
        alloc("low-a", ["a-g0"], 9000, qos="low", preemptible=True),
        alloc("keep-a", ["a-g1"], 9000, qos="low", preemptible=False),
        alloc("keep-b", ["b-g0"], 9000, qos="high", preemptible=True),
        alloc("low-c", ["c-g0"], 9000, qos="low", preemptible=True),
    ]
    result = _whole_node_case(victims)
    assert result.preemptions == ()  # only node c could be cleared; 8 GPUs need two nodes
    assert by_id(result)["vip"].reason != "preempting"


def test_it_explains_why_each_booking_waits():
    devices = gpus("a") + gpus("b", 8, state="down")
    allocations = [
        alloc("run", [f"a-g{i}" for i in range(4)], 300),
        alloc("adv", ["a-g4", "a-g5", "a-g6", "a-g7"], 900, start=50, running=False),
    ]
    pending = [
        req("first", 4, duration=40, submit=0),  # fits before the reservation: starts
        req("held", 4, duration=40, submit=1),  # would fit now but first took it
        req("resv", 2, duration=100, submit=2),  # blocked only by the advance reservation
        req("busy", 8, duration=10, submit=3),  # needs a whole node
        req("never", 64, submit=4),
    ]
    lines = by_id(plan(state(devices, pending, allocations), FIFO_ORDER))
    assert [lines[b].reason for b in ("first", "held", "resv", "never")] == [
        "starting",
        "priority",
        "reservation",
        "never",
    ]
    assert lines["busy"].reason == "node_down"
    assert [lines[b].position for b in ("first", "held", "resv", "busy", "never")] == [
        1,
        2,
        3,
        4,
        5,
    ]
    assert lines["never"].start is None and lines["held"].start == 300


@pytest.mark.parametrize(
    ("request_", "quota", "word"),
    [
        (req("x", 16), None, "never has 16"),
        (req("x", mig_profile="7g.80gb"), None, "MIG 7g.80gb"),
        (req("x", 4), Quota(max_gpus=2), "limit is 2"),
        (req("x", 4, duration=4 * 3600), Quota(gpu_hours_budget=10), "GPU-hours"),
        (req("x", 4), Quota(max_gpus=8, gpu_hours_budget=10), None),
    ],
)
def test_it_refuses_at_submission_what_could_never_run(request_, quota, word):
    devices = gpus("a", 8, state="down") + mig("m", {0: [MIG_3G]})
    reason = never_fits(request_, devices, quota)
    assert (reason is None) if word is None else (word in reason)


@pytest.mark.parametrize(("fades", "old_first"), [(True, True), (False, False)])
def test_it_fades_the_small_job_bonus_as_a_booking_ages(fades, old_first):
    # weight_age == weight_size; a scale at which the 80 GPU-hour job gets almost no size bonus
    policy = Policy(
        age_max_s=1000.0,
        size_fades_with_age=fades,
        size_scale_gpu_s=8 * 3600.0,
        size_width_share=None,
        **UNPROTECTED,
    )
    old_big = req("old", 8, duration=36_000, submit=0)
    young_small = req("young", 1, duration=60, submit=3800)  # a fifth of the way to saturation
    lines = by_id(plan(state(NODE, [old_big, young_small], SIX_BUSY, now=4000.0), policy))
    assert (lines["old"].position == 1) is old_first
    assert (lines["old"].priority.size == 0.0) is fades


def test_it_runs_a_short_whole_node_job_before_an_older_one_many_times_longer():
    # Both nodes busy for two days; a 16-GPU job of 6 days, then one of 5 hours a day later.
    devices = gpus("a") + gpus("b")
    busy = [alloc("run", [d.id for d in devices], 172_800.0)]
    pending = [
        req("long", 16, duration=525_000, submit=0),
        req("short", 16, duration=18_000, submit=86_000),
    ]
    lines = by_id(plan(state(devices, pending, busy, now=86_400.0), Policy(**UNPROTECTED)))
    assert lines["short"].position == 1
    assert lines["short"].start == 172_800.0
    assert lines["long"].start == 172_800.0 + 18_000
    # On an 8 GPU-hour scale both look equally huge (bonus near 0) and the older one goes first.
    old_scale = Policy(
        size_scale_gpu_s=8 * 3600.0, size_width_share=None, age_max_s=7 * 86400.0, **UNPROTECTED
    )
    assert by_id(plan(state(devices, pending, busy, now=86_400.0), old_scale))["long"].position == 1


def test_it_never_lets_protection_override_qos():
    pending = [
        req("old-low", 8, duration=9000, submit=0, qos="low"),
        req("new-high", 8, submit=900, qos="high"),
    ]
    lines = by_id(
        plan(
            state(NODE, pending, SIX_BUSY, now=1000.0),
            Policy(protect_after_runs=1e3, protect_after_max_s=1.0),
        )
    )
    assert lines["new-high"].position == 1


def test_it_puts_protected_bookings_first_in_arrival_order():
    policy = Policy(protect_after_runs=1e3, protect_after_max_s=500.0, protect_oldest=0)
    pending = [
        req("big-old", 8, duration=9000, submit=0),
        req("mid-old", 4, duration=9000, submit=100),
        req("small-new", 1, duration=10, submit=900),
    ]
    lines = by_id(plan(state(NODE, pending, SIX_BUSY, now=1000.0), policy))
    assert [lines[b].position for b in ("big-old", "mid-old", "small-new")] == [1, 2, 3]
    unguarded = by_id(plan(state(NODE, pending, SIX_BUSY, now=1000.0), Policy(**UNPROTECTED)))
    assert unguarded["small-new"].position == 1


@pytest.mark.parametrize("gpus_", [8, 16, 64, 80])
def test_it_protects_an_old_booking_of_any_width(gpus_):
    devices = tuple(d for node in "abcdefghij" for d in gpus(node))  # 80 GPUs
    busy = [alloc("run", [d.id for d in devices], 400_000.0)]
    pending = [
        req("old", gpus_, duration=86_400, submit=0),
        req("new", 1, duration=60, submit=199_000),
    ]
    for policy in (
        Policy(protect_after_runs=1e3, protect_after_max_s=100_000.0, protect_oldest=0),
        Policy(),
    ):
        lines = by_id(plan(state(devices, pending, busy, now=200_000.0), policy))
        assert lines["old"].position == 1
        assert lines["old"].start == 400_000.0 and lines["old"].device_ids


@pytest.mark.parametrize(
    ("gpus_", "duration", "width_gpus", "factor"),
    [
        (1, 3600, 64.0, 1.0),  # a 1-GPU hour
        (1, 1_443_363, 64.0, 0.990),  # 1 GPU for 16.7 days: 401 GPU-hours, one GPU wide
        (8, 10 * 86_400, 64.0, 0.727),  # one node for 10 days
        (64, 5 * 3600, 64.0, 0.667),  # the plain scale at 64 GPUs
        (64, 6 * 86_400, 64.0, 0.065),
        (1, 1_443_363, None, 0.615),  # plain GPU-seconds: long narrow jobs rank low
        (8, 10 * 86_400, None, 0.25),
    ],
)
def test_it_weighs_the_size_of_a_booking_by_its_width(gpus_, duration, width_gpus, factor):
    policy = Policy(
        size_width_gpus=width_gpus,
        size_width_share=None,
        size_scale_gpu_s=640 * 3600.0,
        weight_size=1.0,
    )
    booking = req("x", gpus_, duration=duration, submit=0)
    scales = site_scales(policy, 64.0, [])
    assert priority_of(booking, 0.0, float(gpus_), 1.0, policy, scales).size == pytest.approx(
        factor, abs=1e-3
    )


@pytest.mark.parametrize("capacity", [32.0, 4096.0])
def test_it_measures_size_and_width_against_the_site(capacity):
    policy = Policy(weight_size=1.0)
    scales = site_scales(policy, capacity, [3600.0, 7200.0, 36_000.0])
    assert scales.run_s == 7200.0  # the median running request
    # The same share of the cluster for the same typical run gets the same factor at any size.
    half = req("x", int(capacity / 2), duration=7200, submit=0)
    size = priority_of(half, 0.0, capacity / 2, 1.0, policy, scales).size
    other = site_scales(policy, 64.0, [3600.0, 7200.0, 36_000.0])
    assert size == pytest.approx(
        priority_of(req("y", 32, duration=7200, submit=0), 0.0, 32.0, 1.0, policy, other).size
    )


def test_it_plans_the_same_whatever_the_input_order():
    devices = gpus("a") + gpus("b", 8, temps=[50.0] * 8) + mig("m", {0: [MIG_3G, MIG_3G]})
    pending = [req(f"r{i}", gpus=1 + i % 3, duration=100 + 10 * i, submit=i % 4) for i in range(9)]
    pending.append(req("mig", mig_profile=MIG_3G))
    first = plan(state(devices, pending, SIX_BUSY), Policy())
    again = plan(state(tuple(reversed(devices)), list(reversed(pending)), SIX_BUSY), Policy())
    assert first == again


def test_it_ignores_preemptible_bookings_on_down_nodes():
    devices = gpus("a", 2) + gpus("b", 2, state="down")
    running = [
        alloc("on-down", ["b-g0", "b-g1"], 9000, qos="low", preemptible=True),
        alloc("on-up", ["a-g0", "a-g1"], 9000, qos="low", preemptible=True),
    ]
    result = plan(state(devices, [req("vip", 2, qos="high")], running, now=1000.0), Policy())
    assert [p.booking_id for p in result.preemptions] == ["on-up"]


def test_it_names_the_limit_a_booking_can_never_fit_under():
    result = plan(state(NODE, [req("x", 4)], user_quotas={"u": Quota(max_gpus=2)}), Policy())
    line = by_id(result)["x"]
    assert (line.start, line.reason) == (None, "quota")
    assert line.detail == "user u quota: limit 2 GPUs, asks 4"
