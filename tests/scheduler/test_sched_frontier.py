"""Dominance between replay results: the sweep's 'dominated by' column."""

from __future__ import annotations

import pytest

from scheduler.frontier import dominates, dominators, shown_no_worse


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
