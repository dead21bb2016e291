"""The reference policies (scheduler/presets.py): each one's order pinned on one hand-made queue.

One node of 8 GPUs, 4 of them busy until t = 300,000, at now = 200,000 s (2.3 days). Five pending
bookings whose arrival, GPU-seconds and response ratio orders all differ, waiting more than 2 days
(A), 1 day (B), 12 hours (C) and less (E, D):

| booking | submitted | waited | GPUs | duration | GPU-seconds | (wait + duration) / duration |
|---|---|---|---|---|---|---|
| A | 0 | 200,000 | 4 | 50,000 | 200,000 | 5.0 |
| B | 100,000 | 100,000 | 2 | 60,000 | 120,000 | 2.7 |
| C | 150,000 | 50,000 | 1 | 80,000 | 80,000 | 1.6 |
| E | 185,000 | 15,000 | 2 | 5,000 | 10,000 | 4.0 |
| D | 190,000 | 10,000 | 1 | 1,000 | 1,000 | 11.0 |
"""

from __future__ import annotations

import pytest

from scheduler import Policy, plan
from scheduler.presets import PRESETS, REFERENCE_NAMES, preset_policy
from scheduler.replay import POLICIES
from tests.scheduler.sched_factories import alloc, gpus, req, state

NODE = gpus("a")
BUSY = [alloc("run", [f"a-g{i}" for i in range(4)], 300_000.0)]
QUEUE = [
    req("A", 4, duration=50_000, submit=0),
    req("B", 2, duration=60_000, submit=100_000),
    req("C", 1, duration=80_000, submit=150_000),
    req("E", 2, duration=5_000, submit=185_000),
    req("D", 1, duration=1_000, submit=190_000),
]
# preset -> (walk order, bookings that start now, bookings holding devices for later)
EXPECTED = {
    # Arrival order, every booking reserved: A takes the 4 free GPUs.
    "conservative": ("ABCED", "A", "BCED"),
    # Smallest first, only the first that cannot start (B) reserved.
    "sjf-easy": ("DECBA", "DEC", "B"),
    # D (11.0) A (5.0) E (4.0) B (2.7) C (1.6): D starts; A, the head, takes the 4 GPUs free
    # once D ends, so nothing else fits beside it.
    "hrrn-easy": ("DAEBC", "D", "A"),
    # The oldest (A) starts and hands the head to the next oldest (B); the rest smallest first.
    "easy-sjbf": ("ABDEC", "A", "B"),
    # Protected past 2 days: A only, and it starts; then smallest first, D the head.
    "sjf-protect-2d": ("ADECB", "A", "D"),
    "sjf-protect-1d": ("ABDEC", "A", "B"),
    "sjf-protect-12h": ("ABCDE", "A", "BC"),
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_it_walks_the_queue_in_each_reference_policys_order(name):
    order, starting, holding = EXPECTED[name]
    result = plan(state(NODE, QUEUE, BUSY, now=200_000.0), preset_policy(name))
    walked = sorted(result.planned, key=lambda line: line.position)
    assert "".join(line.booking_id for line in walked) == order
    assert "".join(sorted(start.booking_id for start in result.starts)) == "".join(sorted(starting))
    held = {line.booking_id for line in walked if line.device_ids and line.start > 200_000.0}
    assert held == set(holding)


def test_it_names_every_reference_policy_in_the_replay():
    assert set(REFERENCE_NAMES) == set(EXPECTED)
    for name in REFERENCE_NAMES:
        replayed = POLICIES[name]
        assert (replayed.order, replayed.backfill) == (
            PRESETS[name]["order"],
            PRESETS[name]["backfill"],
        )


def test_it_refuses_an_unknown_order():
    with pytest.raises(ValueError, match="order must be one of"):
        Policy(order="random")


def test_it_keeps_the_previous_default_as_a_named_preset():
    previous = preset_policy("multifactor")
    assert (previous.order, previous.backfill, previous.protect_oldest) == (
        "priority",
        "conservative",
        1,
    )
    walked = sorted(
        plan(state(NODE, QUEUE, BUSY, now=200_000.0), previous).planned, key=lambda p: p.position
    )
    assert all(line.device_ids for line in walked if line.start > 200_000.0)  # all reserved
    assert "multifactor" in PRESETS and "multifactor" in POLICIES
