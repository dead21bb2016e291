"""Dependencies and job arrays in the allocator: table-driven, no database."""

from __future__ import annotations

from dataclasses import replace

import pytest

from scheduler import plan
from scheduler.dependencies import ArraySpecError, parse_array, parse_dependency
from scheduler.replay import replay_trace
from scheduler.types import OUTCOME_NOT_OK, OUTCOME_OK, Dependency, Policy
from tests.bounded import measured
from tests.scheduler.sched_factories import MULTIFACTOR, alloc, gpus, req, state

POLICY = Policy(**MULTIFACTOR)  # every booking planned and reserved


def _line(result, bid):
    return next(line for line in result.planned if line.booking_id == bid)


# (kind, how the target ended or None while it runs, starts now?, ends as never met?)
DEPENDENCY_CASES = [
    ("afterok", None, False, False),
    ("afterok", OUTCOME_OK, True, False),
    ("afterok", OUTCOME_NOT_OK, False, True),
    ("afterany", None, False, False),
    ("afterany", OUTCOME_OK, True, False),
    ("afterany", OUTCOME_NOT_OK, True, False),
    ("afternotok", None, False, False),
    ("afternotok", OUTCOME_NOT_OK, True, False),
    ("afternotok", OUTCOME_OK, False, True),
]


@pytest.mark.parametrize(("kind", "outcome", "starts", "never"), DEPENDENCY_CASES)
def test_it_starts_a_dependent_booking_only_when_its_dependency_is_met(
    kind, outcome, starts, never
):
    outcomes = {"41": outcome} if outcome else {}
    pending = [req("42", after=(Dependency(kind, "41"),))]
    result = plan(state(gpus("a"), pending, outcomes=outcomes), POLICY)
    line = _line(result, "42")
    assert (line.reason == "starting") is starts
    assert [s.booking_id for s in result.starts] == (["42"] if starts else [])
    assert ("42" in result.never_met) is never
    if not starts:
        assert line.reason == "dependency"
        assert line.start is None and line.device_ids == ()
        assert "41" in line.detail
    if never:
        assert line.detail.startswith("dependency never satisfied")


def test_it_holds_nothing_for_a_booking_waiting_on_a_dependency():
    # 42 would take the whole node first by age; while it waits, 43 starts on it.
    pending = [
        req("42", gpus=8, submit=0.0, after=(Dependency("afterok", "41"),)),
        req("43", gpus=8, submit=10.0),
    ]
    result = plan(state(gpus("a"), pending, now=20.0), POLICY)
    assert [s.booking_id for s in result.starts] == ["43"]


def test_it_does_not_preempt_for_a_booking_waiting_on_a_dependency():
    high = Policy(preempt_grace_s=0.0)
    running = [alloc("9", [f"a-g{i}" for i in range(8)], end=1000.0, qos="low", preemptible=True)]
    waiting = req("42", gpus=8, qos="high", after=(Dependency("afterok", "41"),))
    result = plan(state(gpus("a"), [waiting], running, now=10.0), high)
    assert result.preemptions == ()
    ready = req("42", gpus=8, qos="high")
    assert plan(state(gpus("a"), [ready], running, now=10.0), high).preemptions != ()


def test_it_ends_a_whole_chain_after_a_failed_booking_in_one_pass():
    pending = [
        req("42", after=(Dependency("afterok", "41"),)),
        req("43", after=(Dependency("afterok", "42"),)),
        req("44", after=(Dependency("afternotok", "43"),)),
    ]
    result = plan(state(gpus("a"), pending, outcomes={"41": OUTCOME_NOT_OK}), POLICY)
    assert sorted(result.never_met) == ["42", "43"]
    assert result.starts[0].booking_id == "44"


def test_it_waits_for_every_dependency():
    after = (Dependency("afterok", "40"), Dependency("afterany", "41"))
    result = plan(state(gpus("a"), [req("42", after=after)], outcomes={"40": "ok"}), POLICY)
    assert _line(result, "42").detail == "waits for afterany:41"


# (running tasks of the array, limit, pending tasks) -> tasks starting now
ARRAY_CASES = [
    (0, 2, 5, 2),
    (1, 2, 5, 1),
    (2, 2, 5, 0),
    (0, None, 5, 5),
    (3, 10, 5, 5),
]


@pytest.mark.parametrize(("running", "limit", "pending", "starting"), ARRAY_CASES)
def test_it_runs_at_most_the_array_limit_at_once(running, limit, pending, starting):
    allocations = [
        alloc(f"r{i}", [f"a-g{i}"], end=500.0, array="7", user="u", project="p")
        for i in range(running)
    ]
    tasks = [req(f"t{i}", submit=float(i), array="7", array_limit=limit) for i in range(pending)]
    result = plan(state(gpus("a", 16), tasks, allocations), POLICY)
    assert len(result.starts) == starting
    waiting = [line for line in result.planned if line.reason != "starting"]
    for line in waiting:
        assert line.reason == "array_limit"
        assert line.detail == f"array 7: {limit} of at most {limit} tasks running"
        # Planned for when a task of the array ends.
        assert line.start is not None and line.start > 0.0


def test_it_plans_later_array_tasks_after_earlier_ones_end():
    tasks = [
        req(f"t{i}", duration=100.0, submit=float(i), array="7", array_limit=2) for i in range(5)
    ]
    result = plan(state(gpus("a", 16), tasks), POLICY)
    starts = sorted(_line(result, f"t{i}").start for i in range(5))
    assert starts == [0.0, 0.0, 100.0, 100.0, 200.0]


def test_it_does_not_count_other_arrays_against_the_limit():
    allocations = [alloc("r0", ["a-g0"], end=500.0, array="8")]
    tasks = [req("t0", array="7", array_limit=1)]
    assert len(plan(state(gpus("a"), tasks, allocations), POLICY).starts) == 1


@pytest.mark.parametrize(
    ("spec", "task_ids", "limit"),
    [
        ("0-99%10", tuple(range(100)), 10),
        ("1,3,5-7", (1, 3, 5, 6, 7), None),
        ("0-20:5%2", (0, 5, 10, 15, 20), 2),
        ("4", (4,), None),
    ],
)
def test_it_parses_array_specs(spec, task_ids, limit):
    parsed = parse_array(spec)
    assert parsed.task_ids == task_ids and parsed.limit == limit


@pytest.mark.parametrize("spec", ["", "%3", "a-b", "5-2", "0-9%0", "0-9%x", "0-5000", "-1"])
def test_it_refuses_bad_array_specs(spec):
    with pytest.raises(ArraySpecError):
        parse_array(spec)


def test_it_parses_dependencies_like_slurm():
    assert parse_dependency("afterok:41:42,afternotok:7, 9") == (
        Dependency("afterok", "41"),
        Dependency("afterok", "42"),
        Dependency("afternotok", "7"),
        Dependency("afterok", "9"),
    )


@pytest.mark.parametrize("text", ["afterwards:4", "afterok:x", "afterok:", ""])
def test_it_refuses_bad_dependencies(text):
    with pytest.raises(ValueError):
        parse_dependency(text)


def test_it_replays_dependencies_with_the_allocators_rules(tmp_path):
    path = tmp_path / "deps.csv"
    path.write_text(
        "job_id,user,submit_time_s,duration_s,num_gpus,dependency,exit_code\n"
        "a,,0,100,8,,1\n"  # fails
        "b,,1,100,8,afterok:a,0\n"  # never met
        "c,,2,100,8,afternotok:a,0\n"  # runs after a
        "d,,3,100,8,afterany:c,0\n"  # runs after c
    )
    result = replay_trace(str(path), 8, "portal")
    assert result["dependency_never"] == 1
    assert result["jobs"] == 3
    # a, then c, then d: one after the other on the single node.
    assert result["makespan_s"] == 300.0


# (runtimes of node a, of node b, the request's runtimes) -> the node it starts on (None: never)
RUNTIME_CASES = [
    ((), ("podman",), ("podman", "docker"), "b"),
    (("apptainer",), ("podman",), ("apptainer", "singularity"), "a"),
    ((), (), ("podman",), None),
    ((), (), (), "a"),
]


@pytest.mark.parametrize(("on_a", "on_b", "needs", "node"), RUNTIME_CASES)
def test_it_places_a_container_only_on_a_node_with_a_runtime_for_it(on_a, on_b, needs, node):
    devices = [replace(d, runtimes=on_a) for d in gpus("a", 2)]
    devices += [replace(d, runtimes=on_b) for d in gpus("b", 2)]
    result = plan(state(devices, [req("42", runtimes=needs)]), POLICY)
    if node is None:
        assert result.starts == () and _line(result, "42").reason == "never"
    else:
        assert result.starts[0].device_ids[0].startswith(f"{node}-")


def test_it_keeps_a_multi_node_container_on_nodes_with_the_runtime():
    devices = [replace(d, runtimes=("podman",)) for d in gpus("a") + gpus("c")]
    devices += list(gpus("b"))
    result = plan(state(devices, [req("42", gpus=16, runtimes=("podman",))]), POLICY)
    assert {d.split("-")[0] for d in result.starts[0].device_ids} == {"a", "c"}


@pytest.mark.parametrize(
    "spec",
    ["0-99999999999999999999", "0-99999999999999999999:1%5", "0-999,5-99999999999999999999"],
)
def test_it_refuses_a_huge_array_range_without_making_its_ids(spec):
    with measured() as cost, pytest.raises(ArraySpecError, match="at most 1000 tasks"):
        parse_array(spec)
    assert cost.cheap(), cost


@pytest.mark.parametrize("spec", ["٠-٩", "0-٩", "١٢", "0-9:٢", "0-9%٣", "+5", "0x10"])
def test_it_refuses_array_specs_of_other_than_ascii_digits(spec):
    with pytest.raises(ArraySpecError):
        parse_array(spec)


def test_it_refuses_task_ids_past_their_column():
    assert parse_array(f"{2**31 - 1}").task_ids == (2**31 - 1,)
    with pytest.raises(ArraySpecError, match="a task id is at most 2147483647"):
        parse_array(f"{2**31}")


@pytest.mark.parametrize("text", ["afterok:١", "٤٢"])
def test_it_refuses_dependencies_on_ids_of_other_than_ascii_digits(text):
    with pytest.raises(ValueError, match="not a booking id"):
        parse_dependency(text)


def test_it_refuses_a_long_dependency_list_as_it_reads_it():
    text = ":".join(["afterok"] + ["1"] * 1_000_000)
    with measured() as cost, pytest.raises(ValueError, match="at most 2000 characters"):
        parse_dependency(text)
    assert cost.cheap(), cost
    with pytest.raises(ValueError, match="at most 32 dependencies"):
        parse_dependency(":".join(["afterok"] + [str(i) for i in range(1, 40)]))
