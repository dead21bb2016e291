"""Maintenance windows in the allocator: nothing crosses a window on its nodes; the reason."""

from __future__ import annotations

from dataclasses import replace

import pytest
from sched_factories import FIFO_ORDER, MIG_1G, alloc, by_id, gpus, mig, req, shared, state

from scheduler import Policy, plan
from scheduler.types import NODE_MAINTENANCE, REASON_MAINTENANCE, REASON_NODE_DOWN, Window

A, B = gpus("a", 2), gpus("b", 2)
WINDOW = Window("7", "firmware", 1000.0, 2000.0, ("a",))


@pytest.mark.parametrize(
    ("devices", "pending", "windows", "allocations", "want_start", "want_node", "want_reason"),
    [
        # Ends before the window starts: starts now on the window's node.
        (A, [req("x", duration=900)], (WINDOW,), (), 0.0, "a", "starting"),
        # Ends exactly at the window's start: still fits.
        (A, [req("x", duration=1000)], (WINDOW,), (), 0.0, "a", "starting"),
        # Would cross the window's start: planned at its end, with the reason.
        (A, [req("x", duration=1001)], (WINDOW,), (), 2000.0, "a", REASON_MAINTENANCE),
        # Another node without a window takes it now.
        (A + B, [req("x", duration=5000)], (WINDOW,), (), 0.0, "b", "starting"),
        # A window on other nodes changes nothing.
        (A, [req("x", duration=5000)], (Window("8", "", 1000, 2000, ("z",)),), (), 0.0, "a", None),
        # A window that ended changes nothing.
        (A, [req("x", duration=5000)], (Window("9", "", -50, -1, ("a",)),), (), 0.0, "a", None),
        # Resources free at 500, the window from 1000: moved past the window, not to 500.
        (
            A,
            [req("x", 2, duration=600)],
            (WINDOW,),
            [alloc("run", ["a-g0"], 500)],
            2000.0,
            "a",
            REASON_MAINTENANCE,
        ),
        # MIG instances of a window's node are held off the same way.
        (
            mig("m", {0: [MIG_1G]}),
            [req("x", mig_profile=MIG_1G, duration=1500)],
            (Window("5", "", 1000, 2000, ("m",)),),
            (),
            2000.0,
            "m",
            REASON_MAINTENANCE,
        ),
    ],
)
def test_it_keeps_bookings_off_a_window_on_its_nodes(
    devices, pending, windows, allocations, want_start, want_node, want_reason
):
    result = plan(state(devices, pending, allocations, windows=windows), FIFO_ORDER)
    line = by_id(result)["x"]
    assert line.start == want_start
    assert {d.split("-")[0] for d in line.device_ids} == {want_node}
    if want_reason is not None:
        assert line.reason == want_reason


def test_it_names_the_window_that_moved_a_start():
    line = by_id(plan(state(A, [req("x", duration=1500)], windows=(WINDOW,)), FIFO_ORDER))["x"]
    assert line.reason == REASON_MAINTENANCE
    assert line.detail.startswith("maintenance window 7 (firmware) on a from 1970-01-01 00:16")


def test_it_plans_a_node_drained_for_a_window_from_the_windows_end():
    drained = gpus("a", 2, state=NODE_MAINTENANCE)
    now_window = Window("1", "kernel", -100.0, 3000.0, ("a",))
    line = by_id(plan(state(drained, [req("x")], windows=(now_window,)), FIFO_ORDER))["x"]
    assert (line.start, line.reason) == (3000.0, REASON_MAINTENANCE)
    assert "maintenance window 1 (kernel)" in line.detail
    # Without its window (deleted, or over) a maintenance node is down: nothing is planned there.
    line = by_id(plan(state(drained, [req("x")]), FIFO_ORDER))["x"]
    assert (line.start, line.reason) == (None, REASON_NODE_DOWN)


def test_it_moves_a_booking_that_would_fit_now_but_for_a_window():
    # Both GPUs of a are free now, b is busy until 1500: the booking goes to b at 1500.
    busy_b = [alloc("run", ["b-g0", "b-g1"], 1500)]
    line = by_id(
        plan(state(A + B, [req("x", 2, duration=1200)], busy_b, windows=(WINDOW,)), FIFO_ORDER)
    )["x"]
    assert line.start == 1500.0
    assert line.device_ids == ("b-g0", "b-g1")
    assert (line.reason, line.detail.split(" (")[0]) == (REASON_MAINTENANCE, "maintenance window 7")


def test_it_never_preempts_into_a_window():
    victim = alloc("low", ["a-g0", "a-g1"], 5000, qos="low", preemptible=True)
    urgent = req("x", 2, duration=1500, submit=-1000, qos="high")
    policy = Policy(preempt_grace_s=0)
    result = plan(state(A, [urgent], [victim], windows=(WINDOW,)), policy)
    assert result.preemptions == ()
    assert by_id(result)["x"].start == 5000.0
    # A short one that ends before the window does preempt.
    short = req("x", 2, duration=900, submit=-1000, qos="high")
    result = plan(state(A, [short], [victim], windows=(WINDOW,)), policy)
    assert [p.booking_id for p in result.preemptions] == ["low"]


def test_it_keeps_a_window_after_a_preemption_frees_the_devices_around_it():
    victim = alloc("low", ["a-g0", "a-g1"], 5000, qos="low", preemptible=True)
    urgent = req("x", 1, duration=500, submit=-1000, qos="high")
    later = req("y", 1, duration=1500, submit=-10)
    result = plan(state(A, [urgent, later], [victim], windows=(WINDOW,)), Policy(preempt_grace_s=0))
    lines = by_id(result)
    assert [p.booking_id for p in result.preemptions] == ["low"]
    assert lines["y"].start == 2000.0  # not now on the freed GPU: 1500 s would cross the window


def test_it_plans_multi_node_bookings_around_a_window():
    line = by_id(plan(state(A + B, [req("x", 4, duration=1500)], windows=(WINDOW,)), FIFO_ORDER))[
        "x"
    ]
    assert line.start == 2000.0
    assert line.reason == REASON_MAINTENANCE


def test_it_blames_a_window_only_when_it_held_the_devices_back():
    one = gpus("a", 1)
    # Busy through the whole window anyway (a running booking it collides with): not moved by it.
    busy = [alloc("run", ["a-g0"], 2000)]
    line = by_id(plan(state(one, [req("x")], busy, windows=(WINDOW,)), FIFO_ORDER))["x"]
    assert (line.start, line.reason) == (2000.0, "resources")
    # Free from 900 until the window: 200 s would cross its start, so it waits for its end.
    busy = [alloc("run", ["a-g0"], 900)]
    line = by_id(plan(state(one, [req("x", duration=200)], busy, windows=(WINDOW,)), FIFO_ORDER))[
        "x"
    ]
    assert (line.start, line.reason) == (2000.0, REASON_MAINTENANCE)
    # Free from 1500, inside the window (the running booking collides with it): the window
    # moves the start from 1500 to its end, so it is to blame.
    busy = [alloc("run", ["a-g0"], 1500)]
    line = by_id(plan(state(one, [req("x")], busy, windows=(WINDOW,)), FIFO_ORDER))["x"]
    assert (line.start, line.reason) == (2000.0, REASON_MAINTENANCE)


S = shared("s", 1, memory_mib=40000)
S_WINDOW = Window("4", "driver", 1000.0, 2000.0, ("s",))


def _frac(bid, fraction=0.25, memory=None, duration=100.0, **kw):
    return req(bid, duration=duration, gpu_fraction=fraction, gpu_memory_mib=memory, **kw)


@pytest.mark.parametrize(
    ("devices", "pending", "allocations", "want_start", "want_device", "want_reason"),
    [
        # Ends before the window on its shared GPU: starts now.
        (S, [_frac("x", duration=900)], (), 0.0, "s-s0", "starting"),
        # Ends exactly at the window's start: still fits.
        (S, [_frac("x", duration=1000)], (), 0.0, "s-s0", "starting"),
        # Would cross the window's start: planned at its end, with the reason.
        (S, [_frac("x", duration=1001)], (), 2000.0, "s-s0", REASON_MAINTENANCE),
        # A memory request is held off the same way.
        (S, [_frac("x", None, 10000, duration=1500)], (), 2000.0, "s-s0", REASON_MAINTENANCE),
        # Room from 500 (a fraction ends), the window from 1000: moved past the window.
        (
            S,
            [_frac("x", 0.5, duration=600)],
            [alloc("run", ["s-s0"], 500, share=0.75)],
            2000.0,
            "s-s0",
            REASON_MAINTENANCE,
        ),
        # Room beside a running fraction until the window: a short one starts now.
        (
            S,
            [_frac("x", duration=900)],
            [alloc("run", ["s-s0"], 3000, share=0.5)],
            0.0,
            "s-s0",
            None,
        ),
        # Another node's shared GPU without a window takes it now.
        (S + shared("t", 1), [_frac("x", duration=5000)], (), 0.0, "t-s0", "starting"),
        # The window's node still takes the short one (best fit ties go by node order).
        (S + shared("t", 1), [_frac("x", duration=500)], (), 0.0, "s-s0", "starting"),
    ],
)
def test_it_keeps_fractions_off_a_window_on_their_shared_gpus(
    devices, pending, allocations, want_start, want_device, want_reason
):
    result = plan(state(devices, pending, allocations, windows=(S_WINDOW,)), FIFO_ORDER)
    line = by_id(result)["x"]
    assert (line.start, line.device_ids) == (want_start, (want_device,))
    if want_reason is not None:
        assert line.reason == want_reason
    if want_reason == REASON_MAINTENANCE:
        assert line.detail.startswith("maintenance window 4 (driver) on s from")


def test_it_blames_a_window_for_a_fraction_only_when_it_held_the_gpu_back():
    # The GPU is full through the whole window anyway: not moved by it.
    full = [alloc("run", ["s-s0"], 2000, share=1.0)]
    line = by_id(plan(state(S, [_frac("x")], full, windows=(S_WINDOW,)), FIFO_ORDER))["x"]
    assert (line.start, line.reason) == (2000.0, "resources")
    # Room from 900 until the window: 200 s would cross its start, so it waits for its end.
    full = [alloc("run", ["s-s0"], 900, share=1.0)]
    line = by_id(plan(state(S, [_frac("x", duration=200)], full, windows=(S_WINDOW,)), FIFO_ORDER))[
        "x"
    ]
    assert (line.start, line.reason) == (2000.0, REASON_MAINTENANCE)


def test_it_plans_fractions_on_a_shared_node_drained_for_a_window_from_its_end():
    drained = tuple(replace(device, node_state=NODE_MAINTENANCE) for device in S)
    now_window = Window("1", "kernel", -100.0, 3000.0, ("s",))
    line = by_id(plan(state(drained, [_frac("x")], windows=(now_window,)), FIFO_ORDER))["x"]
    assert (line.start, line.device_ids, line.reason) == (3000.0, ("s-s0",), REASON_MAINTENANCE)


def test_it_never_preempts_a_fraction_into_a_window():
    victim = alloc("low", ["s-s0"], 5000, share=1.0, qos="low", preemptible=True)
    policy = Policy(preempt_grace_s=0)
    urgent = _frac("x", 0.5, duration=1500, submit=-1000, qos="high")
    result = plan(state(S, [urgent], [victim], windows=(S_WINDOW,)), policy)
    assert result.preemptions == ()
    assert by_id(result)["x"].start == 5000.0
    # A short one that ends before the window does preempt; the freed share stays off the
    # window: a later fraction that would cross it is planned after it.
    short = _frac("x", 0.5, duration=900, submit=-1000, qos="high")
    later = _frac("y", 0.25, duration=1500, submit=-10)
    result = plan(state(S, [short, later], [victim], windows=(S_WINDOW,)), policy)
    assert [p.booking_id for p in result.preemptions] == ["low"]
    assert by_id(result)["y"].start == 2000.0
