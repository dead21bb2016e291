"""Dominance between replay results: the sweep's 'dominated by' column."""

from __future__ import annotations

import pytest

from scheduler.frontier import (
    closest,
    dominates,
    dominators,
    shown_no_worse,
    starvation_bound,
    target_shortfall,
)


def result(mean, p99, wait_max, util, **extra):
    return {
        "mean_wait_s": mean,
        "p99_wait_s": p99,
        "max_wait_s": wait_max,
        "utilization": util,
        **extra,
    }


BASE = result(100.0, 1000.0, 2000.0, 0.8)


@pytest.mark.parametrize(
    ("other", "expected"),
    [
        (result(100.0, 1000.0, 2000.0, 0.8), False),  # equal everywhere: not better on one
        (result(99.0, 1000.0, 2000.0, 0.8), True),  # better mean, the rest equal
        (result(100.0, 1000.0, 2000.0, 0.81), True),  # higher utilization
        (result(50.0, 500.0, 1000.0, 0.9), True),  # better everywhere
        (result(50.0, 500.0, 2001.0, 0.9), False),  # one worse: max
        (result(50.0, 500.0, 1000.0, 0.79), False),  # one worse: utilization
        (result(100.0 + 1e-12, 1000.0, 1999.0, 0.8), True),  # float noise counts as equal
    ],
)
def test_it_dominates_only_when_no_worse_on_all_and_better_on_one(other, expected):
    assert dominates(other, BASE) is expected


def test_it_names_every_policy_of_a_row_that_dominates_the_default():
    row = {
        "trace": "t",
        "gpus": 8,
        "portal": BASE,
        "easy": result(200.0, 900.0, 1500.0, 0.8),  # better p99 and max, worse mean
        "sjf-easy": result(90.0, 1000.0, 2000.0, 0.8),
        "conservative": result(100.0, 1000.0, 1900.0, 0.8),
    }
    assert dominators(row) == ["sjf-easy", "conservative"]


def test_it_compares_the_shown_start_error_with_easys():
    errors = {"planned_start_error_p50_s": 10.0, "planned_start_error_p90_s": 100.0}
    row = {"portal": result(1, 1, 1, 1, **errors), "easy": result(1, 1, 1, 1, **errors)}
    assert shown_no_worse(row) is True
    row["portal"] = result(1, 1, 1, 1, **{**errors, "planned_start_error_p90_s": 101.0})
    assert shown_no_worse(row) is False
    assert shown_no_worse({"portal": BASE, "easy": BASE}) is None


@pytest.mark.parametrize(
    ("name", "bound"),
    [
        ("portal", "(k+1)W"),  # the protected oldest booking
        ("easy", "(k+1)W"),  # arrival order: the oldest that cannot start is the head
        ("fifo", "(k+1)W"),
        ("conservative", "(k+1)W"),
        ("easy-sjbf", "(k+1)W"),
        ("multifactor", "(k+1)W"),
        ("sjf-protect-1d", "threshold+(k+1)W"),
        ("hrrn-easy", None),  # smaller or longer-waiting work can pass the oldest over
        ("sjf-easy", None),
    ],
)
def test_it_names_the_starvation_bound_each_policy_keeps(name, bound):
    from scheduler.replay import POLICIES

    assert starvation_bound(POLICIES[name]) == bound


def test_it_measures_the_shortfall_from_the_target_and_ranks_bounded_policies():
    easy = result(100.0, 1000.0, 2000.0, 0.8)
    assert target_shortfall(result(50.0, 1000.0, 2000.0, 0.8), easy) == 0.0  # meets all three
    over = target_shortfall(result(100.0, 1100.0, 3000.0, 0.8), easy)
    assert over == pytest.approx(0.5 + 0.1 + 0.5)  # mean, p99 and max over their bounds
    assert target_shortfall(easy, result(0.0, 0.0, 0.0, 0.8)) is None  # nobody waits
    rows = [
        {
            "easy": easy,
            "a": result(60.0, 1000.0, 2000.0, 0.8),  # 0.1 over
            "b": result(40.0, 900.0, 1800.0, 0.8),  # meets it
            "c": result(10.0, 100.0, 100.0, 0.8),  # meets it, but keeps no bound
        },
        {"easy": result(0.0, 0.0, 0.0, 0.8), "a": BASE, "b": BASE, "c": BASE},  # left out
    ]
    ranked = closest(rows, {"a": "(k+1)W", "b": "(k+1)W", "c": None})
    assert [name for name, _, _ in ranked] == ["b", "a"]
    assert ranked[1][1] == pytest.approx(0.1)


def test_the_sweep_prints_the_bounded_policies_closest_first_and_names_the_unbounded():
    from scheduler.replay import POLICIES
    from scheduler.sweep import closest_lines

    easy = result(100.0, 1000.0, 2000.0, 0.8)
    row = {
        "easy": easy,
        "portal": result(40.0, 900.0, 1800.0, 0.8),
        "conservative": result(90.0, 1000.0, 2000.0, 0.8),
        "sjf-easy": result(10.0, 100.0, 100.0, 0.9),
    }
    names = ("portal", "easy", "conservative", "sjf-easy")
    lines = closest_lines([row], {name: POLICIES[name] for name in names})
    assert lines[1:] == [
        "- portal: 0.000 mean, 0.000 worst row, bound (k+1)W",
        "- conservative: 0.400 mean, 0.400 worst row, bound (k+1)W",
        "- easy: 0.500 mean, 0.500 worst row, bound (k+1)W",
        "- no bound (not candidates): sjf-easy",
    ]
