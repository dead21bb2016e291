"""Admission: what could never run, by the rules that would place it (queue or fixed window)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sched_factories import MIG_1G, MIG_3G, gpus, mig, req

from scheduler import Device, Quota, admission_refusal
from scheduler.admission import _fits_one_node, _most_queued, _most_reserved

# a: 8 A100; b: 4 A100 and 4 H100 (a whole node of neither); c: 1 GPU in MIG mode.
MIXED = (
    gpus("a")
    + gpus("b", 4)
    + tuple(Device(f"b-h{i}", "b", "H100") for i in range(4))
    + mig("c", {0: [MIG_3G, MIG_1G]})
)


QUOTA_LIMITS = ("max_gpus", "gpu_hours_budget")


@pytest.mark.parametrize(
    ("request_", "fixed_window", "limit", "most"),
    [
        (req("x", 8, gpu_model="A100"), False, None, None),
        (req("x", 9, gpu_model="A100"), False, "inventory", 8),  # b is not whole A100: only a
        (req("x", 9, gpu_model="A100"), True, None, None),  # a reservation takes b's four too
        (req("x", 12, gpu_model="A100"), True, None, None),
        (req("x", 13, gpu_model="A100"), True, "inventory", 12),
        # No model asked: GPUs of one model, and b is a whole node of neither.
        (req("x", 16), False, "inventory", 8),
        (req("x", 16), True, "inventory", 12),  # a reservation: a's 8 and b's 4 A100
        (req("x", 8), False, None, None),
        (req("x", 16, mixed_models=True), False, None, None),  # any model: b counts whole
        (req("x", 17, mixed_models=True), False, "inventory", 16),
        (req("x", 5, gpu_model="H100"), False, "inventory", 4),
        (req("x", mig_profile=MIG_3G), False, None, None),
        (req("x", mig_profile="7g.80gb"), False, "inventory", 0),
        (req("x", mig_profile="7g.80gb"), True, "inventory", 0),
        (req("x", 4), False, "max_gpus", 2),
        (req("x", 2, duration=6 * 3600), True, "gpu_hours_budget", 10),
    ],
)
def test_it_admits_by_the_rules_that_would_place_the_booking(request_, fixed_window, limit, most):
    quota = Quota(max_gpus=2, gpu_hours_budget=10) if limit in QUOTA_LIMITS else None
    refusal = admission_refusal(request_, MIXED, quota, fixed_window=fixed_window)
    assert (refusal and refusal.limit) == limit
    if refusal is not None:
        assert refusal.limit_value == most


def test_it_counts_a_mig_slice_by_its_fraction_against_the_quota():
    quota = Quota(max_gpus=0.4)
    assert admission_refusal(req("x", mig_profile=MIG_1G), MIXED, quota) is None
    refusal = admission_refusal(req("x", mig_profile=MIG_3G), MIXED, quota)
    assert refusal.limit == "max_gpus" and refusal.asks == pytest.approx(3 / 7)


@settings(max_examples=200, deadline=None)
@given(
    nodes=st.lists(
        st.tuples(st.integers(0, 8), st.integers(0, 8), st.booleans()), min_size=1, max_size=5
    ),
    wanted=st.integers(1, 24),
    model=st.sampled_from([None, "A100", "H100"]),
    fixed_window=st.booleans(),
)
def test_it_answers_the_one_node_case_as_the_full_rules_do(nodes, wanted, model, fixed_window):
    # Each node: some A100, some H100, maybe a MIG GPU. The one-node shortcut admits only what
    # the allocator's or reserve()'s own rule would place on an empty cluster.
    devices = ()
    for n, (a100, h100, has_mig) in enumerate(nodes):
        name = f"n{n}"
        devices += tuple(Device(f"{name}-a{i}", name, "A100") for i in range(a100))
        devices += tuple(Device(f"{name}-h{i}", name, "H100") for i in range(h100))
        if has_mig:
            devices += mig(name, {0: [MIG_3G, MIG_1G]})
    for request in (req("x", wanted, gpu_model=model), req("x", mig_profile=MIG_3G)):
        full = _most_reserved(request, devices) if fixed_window else _most_queued(request, devices)
        if _fits_one_node(request, devices):
            assert full is None
        got = admission_refusal(request, devices, fixed_window=fixed_window)
        assert (got is None) is (full is None)
