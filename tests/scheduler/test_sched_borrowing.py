"""Elastic quotas in the pure allocator: who starts borrowed, where, and what reclaims it."""

from __future__ import annotations

import pytest
from sched_factories import alloc, gpus, req, shared, state

from scheduler import Policy, Quota, plan
from scheduler.borrowing import cheapest_victims
from scheduler.types import ProjectHold

DEVICES = gpus("a", 4)
LENDING = Quota(max_gpus=2, borrowing=True)


def _line(result, bid):
    return next(line for line in result.planned if line.booking_id == bid)


def _started(result):
    return {s.booking_id: s.borrowed_past for s in result.starts}


@pytest.mark.parametrize(
    ("quota", "pending", "expected"),
    [
        # Over its guaranteed share, with borrowing on: starts borrowed past the project's limit.
        (LENDING, [req("r", 2, project="p")], {"r": ("project p",)}),
        # Borrowing off (the default): it waits for its quota.
        (Quota(max_gpus=2), [req("r", 2, project="p")], {}),
        # A GPU-hour budget is never borrowed past.
        (
            Quota(max_gpus=2, borrowing=True, gpu_hours_budget=1.0, gpu_hours_used=1.0),
            [req("r", 2, project="p")],
            {},
        ),
        # max_borrow_gpus bounds what one project borrows at once: 1 of 2 fits.
        (
            Quota(max_gpus=2, borrowing=True, max_borrow_gpus=1),
            [req("r", 2, project="p"), req("s", 1, project="p", submit=1.0)],
            {"s": ("project p",)},
        ),
        # max_borrow_gpus 0: borrowing on, but nothing to borrow.
        (Quota(max_gpus=2, borrowing=True, max_borrow_gpus=0), [req("r", 1, project="p")], {}),
        # An array's running limit is not a quota: never borrowed past.
        (
            LENDING,
            [
                req("t1", 1, project="o", array="A", array_limit=1),
                req("t2", 1, project="p", array="A", array_limit=1, submit=1.0),
            ],
            {"t1": ()},
        ),
    ],
)
def test_it_starts_borrowed_only_past_a_concurrency_limit_that_lends(quota, pending, expected):
    running = [alloc("held", ["a-g0", "a-g1"], end=1000.0, project="p")]
    s = state(DEVICES, pending, running, project_quotas={"p": quota})
    result = plan(s, Policy())
    assert _started(result) == expected
    for bid, past in expected.items():
        line = _line(result, bid)
        assert line.reason == "starting"
        assert ("borrowed past" in line.detail) == bool(past)


def test_it_borrows_past_the_user_limit_too_and_names_both():
    running = [alloc("held", ["a-g0"], end=1000.0, user="u", project="p")]
    s = state(
        DEVICES,
        [req("r", 2, user="u", project="p")],
        running,
        user_quotas={"u": Quota(max_gpus=1, borrowing=True)},
        project_quotas={"p": Quota(max_gpus=1, borrowing=True)},
    )
    (start,) = plan(s, Policy()).starts
    assert start.borrowed_past == ("project p", "user u")


def test_it_never_borrows_the_devices_a_booking_within_its_limits_is_held_for():
    # q (within its limits) needs all four GPUs and holds them from t=100; a borrowed booking
    # may use the two free ones before that, never across it.
    running = [alloc("other", ["a-g2", "a-g3"], end=100.0)]
    within = req("q", 4, project="o")
    long_one = req("long", 2, duration=200.0, project="p", submit=1.0)
    short_one = req("short", 2, duration=50.0, project="p", submit=2.0)
    lends_all = {"p": Quota(max_gpus=0, borrowing=True)}
    s = state(DEVICES, [within, long_one, short_one], running, project_quotas=lends_all)
    result = plan(s, Policy(backfill="easy"))
    assert _started(result) == {"short": ("project p",)}
    assert _line(result, "q").start == 100.0
    assert _line(result, "long").reason == "quota"


def test_it_shares_borrowed_capacity_by_fair_share():
    # p1 already borrows two GPUs; p2 borrows nothing: the one free GPU goes to p2 although
    # p1's booking ranks first.
    running = [
        alloc("b1", ["a-g0", "a-g1"], end=1000.0, project="p1", borrowed=True),
        alloc("w", ["a-g2"], end=1000.0),
    ]
    pending = [
        req("first", 1, project="p1", submit=0.0),
        req("second", 1, project="p2", submit=5.0),
    ]
    quotas = {"p1": Quota(max_gpus=0, borrowing=True), "p2": Quota(max_gpus=0, borrowing=True)}
    result = plan(state(DEVICES, pending, running, now=10.0, project_quotas=quotas), Policy())
    assert _started(result) == {"second": ("project p2",)}


def test_it_counts_a_borrowed_booking_against_no_concurrency_limit():
    # p holds two GPUs borrowed; its limit of 2 is still free for a booking within it.
    running = [alloc("b", ["a-g0", "a-g1"], end=1000.0, project="p", borrowed=True)]
    result = plan(
        state(DEVICES, [req("r", 2, project="p")], running, project_quotas={"p": LENDING}), Policy()
    )
    assert _started(result) == {"r": ()}


def _reclaim_state(borrowed_end=10_000.0, now=1000.0, waited=300.0, **kw):
    running = [
        alloc("w", ["a-g0", "a-g1"], end=10_000.0, project="o"),
        alloc("b", ["a-g2", "a-g3"], end=borrowed_end, project="p", borrowed=True),
    ]
    pending = [req("q", 2, project="o", submit=now - waited)]
    quotas = {"o": Quota(max_gpus=4), "p": LENDING}
    return state(DEVICES, pending, running, now=now, project_quotas=quotas, **kw)


@pytest.mark.parametrize(
    ("waited", "borrowed_end", "policy", "reclaims"),
    [
        # Pending its grace (300 s), the borrowed booking holding on past it: reclaimed.
        (300.0, 10_000.0, Policy(), True),
        # Pending less than its grace: the borrowed work runs on for now.
        (299.0, 10_000.0, Policy(), False),
        # It would start within its grace anyway (the borrowed one ends at 1200, its grace
        # at 900 + 300): no reclaim.
        (100.0, 1200.0, Policy(reclaim_warning_s=250.0), False),
        # The warning comes out of the grace: 300 - 250 leaves 50 s to wait, then it reclaims.
        (50.0, 10_000.0, Policy(reclaim_warning_s=250.0), True),
        (49.0, 10_000.0, Policy(reclaim_warning_s=250.0), False),
        # No grace at all: reclaimed at once although the borrowed one ends in 200 s.
        (0.0, 1200.0, Policy(reclaim_grace_s=0.0), True),
    ],
)
def test_it_reclaims_borrowed_devices_once_the_wait_reaches_the_grace(
    waited, borrowed_end, policy, reclaims
):
    result = plan(_reclaim_state(borrowed_end, waited=waited), policy)
    line = _line(result, "q")
    if reclaims:
        (stop,) = result.preemptions
        assert (stop.booking_id, stop.for_booking_id) == ("b", "q")
        assert stop.reason == "reclaimed for project o's quota"
        assert line.reason == "starting" and line.start == 1000.0
        assert line.detail == "starts now, reclaiming borrowed devices from booking b"
        assert set(line.device_ids) == {"a-g2", "a-g3"}
        assert _started(result) == {"q": ()}
    else:
        assert result.preemptions == ()
        assert line.start == borrowed_end


def test_it_says_when_a_booking_within_its_limits_will_reclaim():
    result = plan(_reclaim_state(waited=60.0), Policy(reclaim_warning_s=30.0))
    line = _line(result, "q")
    assert result.preemptions == ()
    assert line.reason == "preempting"
    assert line.detail == "will preempt booking b at 1970-01-01 00:20 UTC"  # 940 + 270 s


def test_it_reclaims_the_fewest_gpu_hours_lost_first():
    now = 1000.0
    running = [
        alloc("w", ["a-g0", "a-g1"], end=10_000.0, project="o"),
        alloc("old", ["a-g2"], end=10_000.0, start=0.0, project="p", borrowed=True),
        alloc("young", ["a-g3"], end=10_000.0, start=990.0, project="p", borrowed=True),
    ]
    s = state(
        DEVICES,
        [req("q", 1, project="o", submit=now - 300.0)],
        running,
        now=now,
        project_quotas={"o": Quota(max_gpus=4), "p": LENDING},
    )
    (stop,) = plan(s, Policy()).preemptions
    assert stop.booking_id == "young"


def test_it_never_reclaims_for_a_booking_over_its_own_limits():
    s = _reclaim_state()
    s = state(
        s.devices,
        s.pending,
        s.allocations,
        now=s.now,
        project_quotas={"o": Quota(max_gpus=2), "p": LENDING},
    )
    assert plan(s, Policy()).preemptions == ()


def test_it_lets_a_higher_qos_preempt_a_borrowed_booking_not_marked_preemptible():
    running = [
        alloc(
            "b",
            ["a-g0", "a-g1", "a-g2", "a-g3"],
            end=10_000.0,
            project="p",
            qos="low",
            borrowed=True,
        )
    ]
    s = state(DEVICES, [req("h", 4, project="o", qos="high")], running, now=1000.0)
    (stop,) = plan(s, Policy(preempt_grace_s=0)).preemptions
    assert stop.booking_id == "b" and stop.reason == ""


@pytest.mark.parametrize(
    ("options", "missing", "chosen"),
    [
        ([(5.0, 0b01, "a"), (1.0, 0b10, "b")], 1, ["b"]),
        ([(5.0, 0b01, "a"), (1.0, 0b10, "b")], 2, ["a", "b"]),
        # One victim freeing both costs more than two cheap ones.
        ([(5.0, 0b11, "big"), (1.0, 0b01, "x"), (1.0, 0b10, "y")], 2, ["x", "y"]),
        ([(1.0, 0b01, "a")], 2, None),
        ([(1.0, 0b01, "a")], 0, []),
    ],
)
def test_it_picks_the_victims_that_lose_the_fewest_gpu_hours(options, missing, chosen):
    found = cheapest_victims(options, missing)
    assert (None if found is None else [victim[2] for victim in found]) == chosen


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"reclaim_grace_s": -1.0}, "reclaim_grace_s must be >= 0"),
        ({"reclaim_warning_s": -1.0}, "reclaim_warning_s must be >= 0"),
        ({"reclaim_grace_s": 10.0, "reclaim_warning_s": 30.0}, "reclaim_grace_s must be at least"),
    ],
)
def test_it_refuses_a_reclaim_grace_that_cannot_hold_the_warning(fields, named):
    with pytest.raises(ValueError, match=named):
        Policy(**fields)


def test_it_holds_a_borrowed_fractions_share_so_two_never_overfill_a_shared_gpu():
    # Over quota, three 0.5 fractions may borrow; one shared GPU holds two of them, not three.
    devices = shared("s", 1)
    pending = [req(f"f{i}", 1, project="p", submit=float(i), gpu_fraction=0.5) for i in range(3)]
    quota = Quota(max_gpus=0.0, borrowing=True)
    result = plan(state(devices, pending, project_quotas={"p": quota}), Policy())
    starts = [s for s in result.starts if s.borrowed]
    assert len(starts) == 2 and sum(s.share for s in starts) == 1.0
    assert all(s.gpu_memory_mib == 40960 for s in starts)


def test_it_never_reclaims_borrowed_devices_another_projects_reservation_holds():
    # p borrows a-g0..a-g3; class holds a-g0..a-g2 from now: q (project o, within its limits)
    # may reclaim only a-g3, so it cannot start 2 GPUs now.
    borrowed = alloc("b", ["a-g0", "a-g1", "a-g2", "a-g3"], end=1000.0, project="p", borrowed=True)
    hold = ProjectHold("h", "class", 0.0, 50.0, ("a-g0", "a-g1", "a-g2"))
    asks = [req("q", 2, project="o", submit=-400.0)]
    s = state(DEVICES, asks, [borrowed], holds=(hold,))
    result = plan(s, Policy(reclaim_grace_s=0.0, reclaim_warning_s=0.0))
    assert not result.preemptions and not result.starts
