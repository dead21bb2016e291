"""Project reservations in the allocator (scheduler/holds.py): table-driven."""

from __future__ import annotations

import pytest
from sched_factories import gpus, req

from scheduler import Allocation, Policy, Quota, State, plan
from scheduler.holds import (
    MAX_OCCURRENCES,
    WEEK_S,
    HoldRule,
    choose_devices,
    expand,
    occurrences,
)
from scheduler.types import REASON_PROJECT_RESERVATION, REASONS, ProjectHold

NOW = 1000.0
DEVICES = gpus("a", 4) + gpus("b", 4, model="H100")
HOLD = ProjectHold("r1@0", "class", NOW + 500, NOW + 1500, ("a-g0", "a-g1"))


def _line(result, bid):
    return next(line for line in result.planned if line.booking_id == bid)


TWO = gpus("a", 2)


def _state(*pending, holds=(HOLD,), allocations=(), devices=TWO, **kw):
    return State(NOW, devices, allocations, pending, holds=holds, **kw)


def test_it_appends_the_project_reservation_reason():
    assert REASONS[-3:] == (REASON_PROJECT_RESERVATION, "cpus", "memory")


@pytest.mark.parametrize(
    ("duration", "start", "reason"),
    [
        (400.0, NOW, "starting"),  # ends before the window opens: runs now
        (500.0, NOW, "starting"),  # ends exactly at the window's start
        (600.0, NOW + 1500, REASON_PROJECT_RESERVATION),  # would overlap: after the window
    ],
)
def test_it_lets_an_outsider_use_held_devices_only_before_the_window(duration, start, reason):
    result = plan(_state(req("o", duration=duration, project="other")), Policy())
    line = _line(result, "o")
    assert (line.start, line.reason) == (start, reason)


def test_it_plans_a_member_on_the_hold_when_the_window_opens():
    # Both devices are busy until the window opens; the member draws on its hold then.
    busy = Allocation("run", ("a-g0", "a-g1"), 0.0, NOW + 500, "x", "other")
    result = plan(_state(req("m", duration=300.0, project="class"), allocations=(busy,)), Policy())
    line = _line(result, "m")
    assert line.start == NOW + 500
    assert line.reason == REASON_PROJECT_RESERVATION
    assert set(line.device_ids) <= set(HOLD.device_ids)


def test_it_starts_a_member_now_on_an_open_hold_before_other_free_devices():
    hold = ProjectHold("r1@0", "class", NOW - 10, NOW + 1000, ("a-g1",))
    result = plan(_state(req("m", project="class"), holds=(hold,)), Policy())
    assert result.starts[0].device_ids == ("a-g1",)
    assert _line(result, "m").detail == "starts now on its project's reservation"


def test_it_does_not_count_a_members_booking_on_the_hold_against_the_project_limit():
    hold = ProjectHold("r1@0", "class", NOW - 10, NOW + 1000, ("a-g0", "a-g1"))
    quotas = {"class": Quota(max_gpus=0.5)}
    state = _state(req("m", gpus=2, project="class"), holds=(hold,), project_quotas=quotas)
    assert plan(state, Policy()).starts[0].booking_id == "m"
    # Without the hold the limit holds it back.
    assert (
        plan(
            _state(req("m", gpus=2, project="class"), holds=(), project_quotas=quotas), Policy()
        ).starts
        == ()
    )


def test_it_counts_a_member_beyond_the_hold_against_the_limit():
    hold = ProjectHold("r1@0", "class", NOW - 10, NOW + 1000, ("a-g0",))
    quotas = {"class": Quota(max_gpus=1.0)}
    pending = (req("m1", project="class", submit=1), req("m2", project="class", submit=2))
    state = State(NOW, gpus("a", 2), (), pending, holds=(hold,), project_quotas=quotas)
    result = plan(state, Policy())
    # One on the hold (uncounted), one on the general device (counted, within the limit).
    assert sorted(s.booking_id for s in result.starts) == ["m1", "m2"]


def test_it_never_lets_a_preemptor_take_held_devices():
    victim = Allocation("v", ("a-g0",), 0.0, NOW + 5000, "x", "other", qos="low", preemptible=True)
    hold = ProjectHold("r1@0", "class", NOW - 10, NOW + 1000, ("a-g0",))
    urgent = req("h", project="other", qos="high", submit=NOW - 1000)
    state = State(NOW, gpus("a", 1), (victim,), (urgent,), holds=(hold,))
    result = plan(state, Policy(preempt_grace_s=0))
    assert result.preemptions == ()
    assert _line(result, "h").start >= NOW + 1000


def test_it_keeps_a_running_outsider_on_held_devices():
    # A reservation never stops a booking: the member is planned after it.
    run = Allocation("o", ("a-g0", "a-g1"), 0.0, NOW + 800, "x", "other")
    result = plan(_state(req("m", project="class"), allocations=(run,)), Policy())
    assert result.preemptions == ()
    assert _line(result, "m").start == NOW + 800


WEEKLY = HoldRule("r", "class", 0.0, 7200.0, gpus=2, weekly=True)


@pytest.mark.parametrize(
    ("rule", "since", "until", "expected"),
    [
        (WEEKLY, 0.0, WEEK_S, [(0.0, 7200.0)]),
        (WEEKLY, 3600.0, WEEK_S + 1, [(0.0, 7200.0), (WEEK_S, WEEK_S + 7200)]),
        (WEEKLY, 7200.0, WEEK_S + 1, [(WEEK_S, WEEK_S + 7200)]),  # the first ended at since
        (WEEKLY, 10 * WEEK_S, 10 * WEEK_S + 100, [(10 * WEEK_S, 10 * WEEK_S + 7200)]),
        (HoldRule("r", "p", 10.0, 20.0), 0.0, 100.0, [(10.0, 20.0)]),
        (HoldRule("r", "p", 10.0, 20.0), 20.0, 100.0, []),  # one-off in the past
        (HoldRule("r", "p", 20.0, 10.0), 0.0, 100.0, []),  # end before start
        (HoldRule("r", "p", 0.0, WEEK_S + 1, weekly=True), 0.0, 1e9, []),  # overlaps itself
    ],
)
def test_it_expands_occurrences_within_the_horizon(rule, since, until, expected):
    assert occurrences(rule, since, until) == expected


def test_it_bounds_the_expansion_of_a_weekly_rule():
    assert len(occurrences(WEEKLY, 0.0, 1e12)) == MAX_OCCURRENCES


@pytest.mark.parametrize(
    ("rule", "allocations", "expected"),
    [
        (HoldRule("r", "p", 0, 10, gpus=2), (), ("a-g0", "a-g1")),
        (HoldRule("r", "p", 0, 10, gpus=2, gpu_model="H100"), (), ("b-g0", "b-g1")),
        (HoldRule("r", "p", 0, 10, nodes=("b",)), (), ("b-g0", "b-g1", "b-g2", "b-g3")),
        # An outsider holds a-g0 in the window: the node with the most free devices is taken.
        (
            HoldRule("r", "p", 0, 10, gpus=2),
            (Allocation("x", ("a-g0",), 0, 5, "u", "q"),),
            ("b-g0", "b-g1"),
        ),
        (
            HoldRule("r", "p", 0, 10, gpus=4, gpu_model="A100"),
            (Allocation("x", ("a-g0",), 0, 5, "u", "q"),),
            ("a-g0", "a-g1", "a-g2", "a-g3"),  # all it can: the busy one last
        ),
        # A member's own booking does not push the hold away.
        (
            HoldRule("r", "p", 0, 10, gpus=2),
            (Allocation("x", ("a-g0",), 0, 5, "u", "p"),),
            ("a-g0", "a-g1"),
        ),
    ],
)
def test_it_chooses_the_held_devices(rule, allocations, expected):
    assert choose_devices(rule, DEVICES, allocations, 0, 10) == expected


def test_it_releases_unclaimed_devices_after_the_idle_time():
    rule = HoldRule("r", "class", 0.0, 7200.0, gpus=2, idle_release_s=600.0)
    mine = Allocation("m", ("a-g1",), 100.0, 3000.0, "u", "class")
    assert expand((rule,), DEVICES, (), 599.0)[0].device_ids == ("a-g0", "a-g1")
    assert expand((rule,), DEVICES, (), 600.0) == ()
    assert expand((rule,), DEVICES, (mine,), 700.0)[0].device_ids == ("a-g1",)


def test_it_names_each_window_by_its_rule_and_start():
    holds = expand((WEEKLY,), DEVICES, (), 0.0, horizon_s=WEEK_S + 1)
    assert [h.hold_id for h in holds] == ["r@0", f"r@{WEEK_S:.0f}"]


def test_it_plans_a_members_request_across_nodes_in_its_view():
    # Two 4-GPU nodes wholly held: an 8-GPU member request takes both whole nodes.
    devices = gpus("a", 4) + gpus("c", 4)
    hold = ProjectHold("r1@0", "class", NOW - 10, NOW + 1000, tuple(d.id for d in devices))
    member = State(NOW, devices, (), (req("m", gpus=8, project="class"),), holds=(hold,))
    assert plan(member, Policy()).starts[0].booking_id == "m"
    outsider = State(NOW, devices, (), (req("o", gpus=8, project="other"),), holds=(hold,))
    assert _line(plan(outsider, Policy()), "o").start == NOW + 1000
