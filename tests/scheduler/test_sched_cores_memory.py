"""Cores and host memory are consumable per node in every phase of the pass (issue 40)."""

from dataclasses import replace

import pytest
from sched_factories import FIFO_ORDER, alloc, by_id, gpus, mig, req, shared, state

from scheduler import NodeResources, Policy, plan
from scheduler.admission import admission_refusal
from scheduler.types import (
    REASON_CPUS,
    REASON_MEMORY,
    REASON_NEVER,
    REASON_PREEMPTING,
    REASON_STARTING,
)

GIB = 1024
NODE = NodeResources(cpus=16, memory_mib=256 * GIB, gpus=4)


def resources(*names, node=NODE):
    return {name: node for name in names}


def test_it_waits_with_reason_cpus_when_the_gpus_fit_but_the_cores_do_not():
    running = alloc("r", ["a-g0"], end=500.0, cpus=12)
    s = state(gpus("a", 4), [req("b", cpus=8)], [running], node_resources=resources("a"))
    line = by_id(plan(s, FIFO_ORDER))["b"]
    assert line.reason == REASON_CPUS
    assert line.start == 500.0
    assert line.detail == "node a has 4 of 16 cores free, it asks 8"


def test_it_waits_with_reason_memory_when_the_memory_does_not_fit():
    running = alloc("r", ["a-g0"], end=300.0, memory_mib=200 * GIB)
    s = state(
        gpus("a", 4), [req("b", memory_mib=100 * GIB)], [running], node_resources=resources("a")
    )
    line = by_id(plan(s, FIFO_ORDER))["b"]
    assert line.reason == REASON_MEMORY
    assert line.start == 300.0
    assert "node a has 57344 of 262144 MiB of memory free" in line.detail


def test_it_goes_to_the_other_node_where_the_cores_fit():
    running = alloc("r", ["a-g0"], end=500.0, cpus=14)
    s = state(
        gpus("a", 4) + gpus("b", 4),
        [req("x", cpus=4)],
        [running],
        node_resources=resources("a", "b"),
    )
    result = plan(s, FIFO_ORDER)
    assert [start.device_ids[0].split("-")[0] for start in result.starts] == ["b"]


def test_it_starts_as_before_on_a_node_whose_resources_are_unknown():
    running = alloc("r", ["a-g0"], end=500.0, cpus=16)
    s = state(gpus("a", 4), [req("b", cpus=8)], [running])
    assert by_id(plan(s, FIFO_ORDER))["b"].reason == REASON_STARTING


def test_it_plans_a_reservation_at_the_end_that_frees_the_cores():
    # Two running jobs hold all cores; the GPUs free at 100, the cores only at 400.
    running = [
        alloc("short", ["a-g0"], end=100.0, cpus=2),
        alloc("long", ["a-g1"], end=400.0, cpus=14),
    ]
    s = state(gpus("a", 4), [req("big", gpus=2, cpus=4)], running, node_resources=resources("a"))
    line = by_id(plan(s, FIFO_ORDER))["big"]
    assert line.start == 400.0 and line.reason == REASON_CPUS


def test_it_backfills_only_what_the_free_cores_allow():
    running = alloc("r", ["a-g0"], end=1000.0, cpus=8)
    pending = [
        req("head", gpus=4, submit=0.0, cpus=4),  # waits for a-g0
        req("fits", submit=1.0, duration=100.0, cpus=6),
        req("too-many", submit=2.0, duration=100.0, cpus=6),  # 8 + 6 + 6 > 16
    ]
    s = state(gpus("a", 4), pending, [running], node_resources=resources("a"))
    lines = by_id(plan(s, FIFO_ORDER))
    assert lines["fits"].reason == REASON_STARTING
    assert lines["too-many"].reason == REASON_CPUS
    assert lines["too-many"].start == 100.0


@pytest.mark.parametrize(
    ("policy", "cores_each", "started"),
    [
        (FIFO_ORDER, 4, 4),  # proportional: 16 cores / 4 GPUs, all four fit
        (replace(FIFO_ORDER, default_cpus_per_gpu=6), 6, 2),  # 6 + 6 + 6 > 16
    ],
)
def test_it_holds_the_default_cores_of_a_booking_that_asks_none(policy, cores_each, started):
    pending = [req(f"b{i}", submit=float(i)) for i in range(4)]
    s = state(gpus("a", 4), pending, node_resources=resources("a"))
    assert len(plan(s, policy).starts) == started


def test_it_holds_a_mig_slices_proportion_of_the_node():
    # 7 one-slice instances on one GPU of a 1-GPU node with 7 cores: one core each.
    devices = mig("m", {0: ["1g.10gb"] * 7})
    node = NodeResources(cpus=7, memory_mib=70 * GIB, gpus=1)
    running = alloc("r", ["m-g0-0"], end=500.0, cpus=4)
    pending = [req(f"s{i}", mig_profile="1g.10gb", submit=float(i)) for i in range(6)]
    s = state(devices, pending, [running], node_resources={"m": node})
    lines = by_id(plan(s, FIFO_ORDER))
    assert sum(line.reason == REASON_STARTING for line in lines.values()) == 3


def test_it_holds_a_fractions_proportion_of_the_node():
    node = NodeResources(cpus=8, memory_mib=64 * GIB, gpus=1)
    running = alloc("r", ["f-s0"], end=500.0, cpus=6, share=0.25)
    pending = [req(f"q{i}", gpu_fraction=0.25, submit=float(i)) for i in range(3)]
    s = state(shared("f", 1), pending, [running], node_resources={"f": node})
    lines = by_id(plan(s, FIFO_ORDER))
    # 0.25 of the node is 2 cores each: 6 + 2 fits, the next two wait for cores.
    assert [lines[f"q{i}"].reason for i in range(3)] == [REASON_STARTING, REASON_CPUS, REASON_CPUS]


def test_it_takes_whole_nodes_only_where_their_cores_are_free():
    devices = gpus("a", 4) + gpus("b", 4) + gpus("c", 4)
    busy = alloc("cpu-hog", ["a-g0"], end=500.0, cpus=16)
    s = state(
        devices,
        [req("wide", gpus=8, cpus=1), req("wider", gpus=12, cpus=1, submit=1.0)],
        [busy],
        node_resources=resources("a", "b", "c"),
    )
    lines = by_id(plan(s, FIFO_ORDER))
    assert {d.split("-")[0] for d in lines["wide"].device_ids} == {"b", "c"}
    assert lines["wider"].start == 500.0  # a has no core free before the hog ends


def test_it_preempts_victims_until_their_cores_make_room():
    qos = Policy(preempt_grace_s=300)
    victims = [
        alloc("low-a", ["a-g0"], end=9000.0, qos="low", preemptible=True, cpus=8),
        alloc("low-b", ["a-g1"], end=9000.0, qos="low", preemptible=True, cpus=8),
    ]
    s = state(
        gpus("a", 4),
        [req("urgent", qos="high", cpus=12)],
        victims,
        now=1000.0,
        node_resources=resources("a"),
    )
    result = plan(s, qos)
    # Two GPUs are free but no core: both victims stop (one frees 8 cores, 12 are asked).
    assert sorted(p.booking_id for p in result.preemptions) == ["low-a", "low-b"]
    assert by_id(result)["urgent"].reason in (REASON_PREEMPTING, REASON_STARTING)


@pytest.mark.parametrize(
    ("asked", "reclaimed"),
    [
        (4, ["b2"]),  # the two GPUs and 8 cores of the later one (fewer GPU-hours lost)
        (12, ["b1", "b2"]),  # 12 cores: both borrowed bookings stop, although one frees the GPUs
        (20, []),  # more cores than the node has: nothing is stopped for it
    ],
)
def test_it_reclaims_borrowed_bookings_until_their_cores_make_room(asked, reclaimed):
    from scheduler import Quota

    running = [
        alloc("b1", ["a-g0", "a-g1"], start=0.0, end=9000.0, project="p", borrowed=True, cpus=8),
        alloc("b2", ["a-g2", "a-g3"], start=10.0, end=9000.0, project="p", borrowed=True, cpus=8),
    ]
    s = state(
        gpus("a", 4),
        [req("q", gpus=2, project="o", submit=0.0, cpus=asked)],
        running,
        now=1000.0,
        node_resources=resources("a"),
        project_quotas={"o": Quota(max_gpus=4), "p": Quota(max_gpus=0, borrowing=True)},
    )
    result = plan(s, Policy(reclaim_grace_s=0.0))
    assert sorted(p.booking_id for p in result.preemptions) == reclaimed
    assert (by_id(result)["q"].start == 1000.0) == bool(reclaimed)


def test_it_says_never_when_no_node_has_the_cores_asked():
    s = state(gpus("a", 4), [req("huge", cpus=64)], node_resources=resources("a"))
    line = by_id(plan(s, FIFO_ORDER))["huge"]
    assert line.reason == REASON_NEVER
    assert (
        line.detail == "asks 64 cores per node, the most a node that could hold its GPUs has is 16"
    )


@pytest.mark.parametrize(
    ("asked", "field"),
    [({"cpus": 17}, "cpus"), ({"memory_mib": 300 * GIB}, "memory_mib"), ({"cpus": 16}, None)],
)
def test_it_refuses_at_submit_more_cores_or_memory_than_any_node_has(asked, field):
    refusal = admission_refusal(
        req("x", **asked), gpus("a", 4), node_resources=resources("a"), policy=Policy()
    )
    assert (refusal and refusal.limit) == field


def test_it_never_over_commits_cores_when_nothing_runs():
    pending = [req(f"b{i}", submit=float(i), cpus=5) for i in range(4)]
    s = state(gpus("a", 4), pending, node_resources=resources("a"))
    lines = by_id(plan(s, FIFO_ORDER))
    assert [lines[f"b{i}"].reason for i in range(4)] == [REASON_STARTING] * 3 + [REASON_CPUS]


# -- limits of cores and memory (Quota.max_cpus, Quota.max_memory_mib) ---------------------------


def _limited(pending, running=(), **quota):
    from scheduler import Quota

    return state(
        gpus("a", 4) + gpus("b", 4),
        pending,
        running,
        node_resources=resources("a", "b"),
        project_quotas={"p": Quota(**quota)},
    )


@pytest.mark.parametrize(
    ("quota", "asks", "detail"),
    [
        ({"max_cpus": 12}, {"cpus": 8}, "project p quota: 8 of 12 cores in use, needs 8"),
        (
            {"max_memory_mib": 96 * GIB},
            {"memory_mib": 64 * GIB},
            "project p quota: 65536 of 98304 MiB of memory in use, needs 65536",
        ),
    ],
)
def test_it_holds_a_booking_past_its_projects_limit_of_cores_or_memory(quota, asks, detail):
    # Two bookings of 8 cores (64 GiB) each, on nodes with room for both: the project's limit
    # lets one run at a time, so the second waits for the first's end with reason quota.
    pending = [req("one", submit=0.0, **asks), req("two", submit=1.0, **asks)]
    result = plan(_limited(pending, **quota), FIFO_ORDER)
    lines = by_id(result)
    assert [s.booking_id for s in result.starts] == ["one"]
    assert (lines["two"].reason, lines["two"].detail) == ("quota", detail)
    assert lines["two"].start == 100.0


def test_it_counts_what_running_bookings_hold_against_the_limit():
    running = [alloc("r", ["a-g0", "a-g1"], end=400.0, project="p", cpus=10)]
    result = plan(_limited([req("x", cpus=4)], running, max_cpus=12), FIFO_ORDER)
    line = by_id(result)["x"]
    assert (line.reason, line.start) == ("quota", 400.0)
    assert line.detail == "project p quota: 10 of 12 cores in use, needs 4"


def test_it_counts_the_default_cores_of_a_booking_that_asks_none():
    # 16 cores and 4 GPUs per node: a GPU's share is 4 cores; two GPUs hold 8.
    pending = [req("one", gpus=2, submit=0.0), req("two", gpus=2, submit=1.0)]
    result = plan(_limited(pending, max_cpus=12), FIFO_ORDER)
    assert [s.booking_id for s in result.starts] == ["one"]
    assert by_id(result)["two"].detail == "project p quota: 8 of 12 cores in use, needs 8"


def test_it_never_starts_a_booking_whose_cores_are_past_the_limit_itself():
    line = by_id(plan(_limited([req("x", cpus=8)], max_cpus=4), FIFO_ORDER))["x"]
    assert (line.reason, line.start) == ("quota", None)
    assert line.detail == "project p quota: limit 4 cores, asks 8"


def test_it_refuses_at_submit_a_booking_past_a_limit_of_cores_even_with_nothing_in_use():
    from scheduler import Quota

    devices = gpus("a", 4)
    kw = {"node_resources": resources("a"), "policy": Policy()}
    refusal = admission_refusal(req("x", cpus=8), devices, Quota(max_cpus=4), **kw)
    assert (refusal.limit, refusal.limit_value, refusal.asks) == ("max_cpus", 4.0, 8.0)
    assert admission_refusal(req("x", cpus=4), devices, Quota(max_cpus=4), **kw) is None
    big = req("x", memory_mib=300 * GIB)  # more than the node too: that refusal first
    assert admission_refusal(big, devices, Quota(max_memory_mib=GIB), **kw).limit == "memory_mib"


@pytest.mark.parametrize(("limit", "preempted"), [(None, ["low"]), (12, [])])
def test_it_does_not_preempt_for_a_booking_its_limit_of_cores_holds_back(limit, preempted):
    from scheduler import Quota

    low = alloc("low", ["a-g0", "a-g1", "a-g2", "a-g3"], end=9000.0, qos="low", preemptible=True)
    mine = alloc("mine", ["b-g0"], end=9000.0, project="p", cpus=10)
    s = state(
        gpus("a", 4) + gpus("b", 1),
        [req("urgent", qos="high", cpus=4)],
        [low, mine],
        now=1000.0,
        node_resources=resources("a", "b"),
        project_quotas={"p": Quota(max_cpus=limit)},
    )
    result = plan(s, Policy(preempt_grace_s=0))
    assert [p.booking_id for p in result.preemptions] == preempted
    # Held back by its limit, it starts when its project's own booking ends.
    assert by_id(result)["urgent"].start == (1000.0 if preempted else 9000.0)
