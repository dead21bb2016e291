"""Shared GPUs in the allocator: fractions packed best fit, never mixed with whole GPUs or MIG
slices, never over 1.0 of compute or over the GPU's memory (docs/scheduling.md, Shared GPUs)."""

from __future__ import annotations

import pytest
from sched_factories import MIG_1G, alloc, by_id, gpus, mig, req, shared, state

from scheduler import Policy, Quota, plan
from scheduler.placement import build_nodes
from scheduler.reserve import Hold, Slot, Wanted, next_window, reserve
from scheduler.sharing import SharedNodes, ShareTimeline, share_on
from scheduler.types import (
    REASON_NEVER,
    REASON_PREEMPTING,
    REASON_PRIORITY,
    REASON_QUOTA,
    REASON_RESERVATION,
    REASON_RESOURCES,
    REASON_STARTING,
    Device,
    ProjectHold,
    Request,
    Window,
)

FIFO = Policy(order="arrival", backfill="conservative", protect_oldest=0)
GPU = Device("s", "n", "A100", shared=True, memory_mib=80000)


@pytest.mark.parametrize(
    ("fraction", "memory", "held"),
    [
        (0.25, None, (0.25, 20000)),  # a compute share holds that share of the memory
        (None, 20000, (0.25, 20000)),  # a memory request holds that share of the compute
        (0.1, 60000, (0.1, 60000)),  # both given: each as asked
        (None, 80000, (1.0, 80000)),  # all of its memory
        (None, 80001, None),  # more memory than the GPU has: never there
        (0.5, 90000, None),
    ],
)
def test_it_derives_the_share_and_memory_a_fraction_holds(fraction, memory, held):
    request = Request("r", "u", "p", 0.0, 10.0, gpu_fraction=fraction, gpu_memory_mib=memory)
    assert share_on(request, GPU) == held


def _frac(bid, fraction=None, memory=None, duration=100.0, submit=0.0, **kw):
    return req(
        bid, duration=duration, submit=submit, gpu_fraction=fraction, gpu_memory_mib=memory, **kw
    )


# (name, devices, running allocations, pending, {booking: (reason, start, device or None)})
CASES = [
    (
        "two quarters and a half share one GPU, a fourth waits for the first to end",
        shared("n", 2),
        (),
        (
            _frac("a", 0.25, duration=100, submit=0),
            _frac("b", 0.25, duration=200, submit=1),
            _frac("c", 0.5, duration=300, submit=2),
            _frac("d", 0.75, duration=50, submit=3),
        ),
        {
            "a": (REASON_STARTING, 0.0, "n-s0"),
            "b": (REASON_STARTING, 0.0, "n-s0"),  # best fit: onto the GPU already in use
            "c": (REASON_STARTING, 0.0, "n-s0"),
            "d": (REASON_STARTING, 0.0, "n-s1"),  # 0.75 does not fit beside them: the other GPU
        },
    ),
    (
        "a fourth quarter waits with a planned start when the only shared GPU is full",
        shared("n", 1),
        (),
        (
            _frac("a", 0.25, duration=100, submit=0),
            _frac("b", 0.25, duration=200, submit=1),
            _frac("c", 0.5, duration=300, submit=2),
            _frac("d", 0.25, duration=50, submit=3),
        ),
        {
            "a": (REASON_STARTING, 0.0, "n-s0"),
            "b": (REASON_STARTING, 0.0, "n-s0"),
            "c": (REASON_STARTING, 0.0, "n-s0"),
            "d": (REASON_PRIORITY, 100.0, "n-s0"),  # held by the three that start first
        },
    ),
    (
        "a whole GPU never lands on a shared GPU, even a free one",
        gpus("n", 1) + shared("n", 1),
        (),
        (req("w1", duration=100, submit=0), req("w2", duration=100, submit=1)),
        {"w1": (REASON_STARTING, 0.0, "n-g0"), "w2": (REASON_PRIORITY, 100.0, "n-g0")},
    ),
    (
        "a fraction never lands on an exclusive GPU",
        gpus("n", 2),
        (),
        (_frac("f", 0.25),),
        {"f": (REASON_NEVER, None, None)},
    ),
    (
        "a MIG slice never lands on a shared GPU, a fraction never on a MIG slice",
        shared("n", 1) + mig("m", {0: [MIG_1G]}),
        (),
        (req("s", mig_profile=MIG_1G, submit=0), req("s2", mig_profile=MIG_1G, submit=1)),
        {"s": (REASON_STARTING, 0.0, "m-g0-0"), "s2": (REASON_PRIORITY, 100.0, "m-g0-0")},
    ),
    (
        "memory is a limit of its own: a small share waits for memory",
        shared("n", 1, memory_mib=80000),
        (),
        (_frac("big", 0.1, 70000, duration=100), _frac("small", 0.1, 20000, submit=1)),
        {"big": (REASON_STARTING, 0.0, "n-s0"), "small": (REASON_PRIORITY, 100.0, "n-s0")},
    ),
    (
        "a memory request goes on the GPU whose share of memory covers it",
        shared("n", 1, memory_mib=40000) + shared("o", 1, memory_mib=80000),
        (),
        (_frac("m", None, 60000),),
        {"m": (REASON_STARTING, 0.0, "o-s0")},
    ),
    (
        "memory above every shared GPU's can never start",
        shared("n", 2, memory_mib=40000),
        (),
        (_frac("m", None, 50000),),
        {"m": (REASON_NEVER, None, None)},
    ),
    (
        "a running fraction holds its share: a half waits, a quarter starts beside it",
        shared("n", 1),
        (alloc("run", ["n-s0"], end=500, share=0.75, gpu_memory_mib=60000),),
        (_frac("half", 0.5, submit=0), _frac("quarter", 0.25, submit=1)),
        {"half": (REASON_RESOURCES, 500.0, "n-s0"), "quarter": (REASON_STARTING, 0.0, "n-s0")},
    ),
    (
        "a whole-device allocation on a shared GPU holds all of it",
        shared("n", 1),
        (alloc("run", ["n-s0"], end=300),),
        (_frac("q", 0.25),),
        {"q": (REASON_RESOURCES, 300.0, "n-s0")},
    ),
    (
        "an advance reservation of a share holds it in its window",
        shared("n", 1),
        (alloc("adv", ["n-s0"], start=50, end=400, running=False, share=0.5),),
        (_frac("long", 0.75, duration=100), _frac("short", 0.5, duration=40, submit=1)),
        {
            "long": (REASON_RESERVATION, 400.0, "n-s0"),
            "short": (REASON_STARTING, 0.0, "n-s0"),  # backfills before the window
        },
    ),
]


@pytest.mark.parametrize(("name", "devices", "allocations", "pending", "expected"), CASES)
def test_it_packs_fractions_onto_shared_gpus(name, devices, allocations, pending, expected):
    lines = by_id(plan(state(devices, pending, allocations), FIFO))
    for booking, (reason, start, device) in expected.items():
        line = lines[booking]
        assert (line.reason, line.start) == (reason, start), (name, booking, line)
        assert line.device_ids == ((device,) if device else ()), (name, booking, line)


def test_it_counts_a_fraction_in_quotas_by_its_share():
    quotas = {"u@p": Quota(max_gpus=0.5)}
    pending = [_frac(f"q{i}", 0.25, submit=i, user="u@p") for i in range(3)]
    lines = by_id(plan(state(shared("n", 2), pending, user_quotas=quotas), FIFO))
    assert [lines[f"q{i}"].reason for i in range(3)] == [
        REASON_STARTING,
        REASON_STARTING,
        REASON_QUOTA,
    ]


def test_it_counts_a_memory_request_by_the_share_it_holds():
    # 40 GiB of an 80 GiB GPU is half of it: with a limit of 0.75, a second one must wait.
    quotas = {"u@p": Quota(max_gpus=0.75)}
    pending = [_frac(f"m{i}", None, 40960, submit=i, user="u@p") for i in range(2)]
    lines = by_id(plan(state(shared("n", 2), pending, user_quotas=quotas), FIFO))
    assert (lines["m0"].reason, lines["m1"].reason) == (REASON_STARTING, REASON_QUOTA)


def test_it_preempts_lower_qos_fractions_to_make_room_for_a_higher_one():
    running = (
        alloc("low1", ["n-s0"], end=900, share=0.5, qos="low", preemptible=True),
        alloc("low2", ["n-s0"], end=900, share=0.25, qos="low", preemptible=True),
        alloc("keep", ["n-s0"], end=900, share=0.25, qos="normal"),
    )
    pending = (_frac("hi", 0.5, submit=-1000, qos="high"),)
    result = plan(state(shared("n", 1), pending, running, now=0.0), Policy(preempt_grace_s=0))
    assert [(p.booking_id, p.for_booking_id) for p in result.preemptions] == [("low1", "hi")]
    line = by_id(result)["hi"]
    assert (line.reason, line.device_ids) == (REASON_PREEMPTING, ("n-s0",))


def test_it_never_preempts_a_whole_gpu_for_a_fraction():
    devices = gpus("n", 1) + shared("n", 1)
    running = (
        alloc("whole", ["n-g0"], end=900, qos="low", preemptible=True),
        alloc("frac", ["n-s0"], end=900, share=1.0, qos="normal"),
    )
    pending = (_frac("hi", 0.5, submit=-1000, qos="high"),)
    result = plan(state(devices, pending, running), Policy(preempt_grace_s=0))
    assert result.preemptions == ()
    assert by_id(result)["hi"].start == 900.0


def test_it_plans_the_same_fraction_when_the_walk_stops_at_it():
    pending = [_frac(f"q{i}", 0.25 * (1 + i % 3), duration=100 + i, submit=i) for i in range(7)]
    s = state(shared("n", 2), pending)
    full = by_id(plan(s, FIFO))
    for request in pending:
        assert plan(s, FIFO, until=request.booking_id).planned[-1] == full[request.booking_id]


def _slot(gpu: int, memory: int = 80000, model: str = "A100", node: int = 0):
    return Slot(node, gpu, None, model, shared=True, memory_mib=memory)


@pytest.mark.parametrize(
    ("wanted", "holds", "placed", "free"),
    [
        # Best fit: onto the GPU already holding a quarter in the window, not the empty one.
        ((0.25, None), (Hold(2, None, 0, 100, 0.25, share=0.25, memory_mib=20000),), (2, 0.25), 2),
        # No room on GPU 2 (three quarters held part of the window): GPU 1.
        ((0.5, None), (Hold(2, None, 50, 150, 0.75, share=0.75, memory_mib=1),), (1, 0.5), 1),
        # A hold that ends before the window leaves all of it.
        ((0.5, None), (Hold(1, None, -100, 0, 1.0),), (1, 0.5), 2),
        # A whole-device hold takes all of a GPU; memory alone takes its share.
        ((None, 40000), (Hold(1, None, 0, 100, 1.0),), (2, 0.5), 1),
        # Memory is a limit of its own.
        ((0.1, 50000), (Hold(1, None, 0, 100, 0.1, share=0.1, memory_mib=40000),), (2, 0.1), 1),
        ((None, 90000), (), None, 0),
    ],
)
def test_it_reserves_a_fraction_on_the_fullest_shared_gpu_with_room(wanted, holds, placed, free):
    slots = (_slot(1), _slot(2), Slot(0, 3, None, "A100"))  # GPU 3 is exclusive
    fraction, memory = wanted
    asked = Wanted(1, 0.0, 100.0, gpu_fraction=fraction, gpu_memory_mib=memory)
    placement = reserve(asked, slots, holds)
    assert placement.free == free
    if placed is None:
        assert placement.slots == ()
    else:
        (slot,) = placement.slots
        assert (slot.gpu, slot.fraction) == placed
        assert slot.held_mib == (memory if memory else int(fraction * 80000))


def test_it_never_reserves_a_whole_gpu_on_a_shared_one():
    slots = (_slot(1), Slot(0, 3, None, "A100"))
    assert [s.gpu for s in reserve(Wanted(1, 0.0, 10.0), slots, ()).slots] == [3]
    assert reserve(Wanted(2, 0.0, 10.0), slots, ()).slots == ()


def test_it_finds_the_next_window_for_a_fraction():
    holds = (Hold(1, None, 0, 300, 0.75, share=0.75, memory_mib=1),)
    asked = Wanted(1, 0.0, 100.0, gpu_fraction=0.5)
    assert next_window(asked, (_slot(1),), holds, until=1000.0) == 300.0


def test_it_says_in_each_start_what_a_fraction_holds():
    pending = [_frac("q", 0.25, submit=0), _frac("m", None, 40000, submit=1), req("w", submit=2)]
    devices = shared("n", 1, memory_mib=80000) + gpus("n", 1)
    starts = {s.booking_id: s for s in plan(state(devices, pending), FIFO).starts}
    assert (starts["q"].share, starts["q"].gpu_memory_mib) == (0.25, 20000)
    assert (starts["m"].share, starts["m"].gpu_memory_mib) == (0.5, 40000)
    assert (starts["w"].share, starts["w"].gpu_memory_mib) == (1.0, 0)


@pytest.mark.parametrize(
    ("memory_mib", "running", "asked", "starts"),
    [
        # Unknown memory (0 MiB reported): compute shares only, so a quarter beside a half fits...
        (0, 0.5, (0.25, None), True),
        # ... but not past the compute left,
        (0, 0.75, (0.5, None), False),
        # and a memory request never fits a GPU of unknown memory.
        (0, 0.25, (None, 1024), False),
        # Known memory: memory counts too.
        (40000, 0.5, (0.25, None), True),
        (40000, 0.5, (None, 30000), False),
    ],
)
def test_it_counts_only_compute_on_a_shared_gpu_of_unknown_memory(
    memory_mib, running, asked, starts
):
    devices = (Device("n-s0", "n", "A100", shared=True, memory_mib=memory_mib),)
    tenant = alloc("t", ["n-s0"], end=900, share=running)
    fraction, memory = asked
    s = state(devices, [_frac("x", fraction, memory)], [tenant])
    # The replay's starts-only walk stops once nothing is free now: it must see the room too.
    for starts_only in (False, True):
        result = plan(s, FIFO, starts_only=starts_only)
        assert [start.booking_id for start in result.starts] == (["x"] if starts else [])


def test_it_reads_a_shared_gpu_of_unknown_memory_as_free_while_compute_is_left():
    unknown = ShareTimeline(0.0, 0)
    unknown.add(0.25, 0, 0.0, 100.0)
    assert unknown.open_at(0.0)
    unknown.add(0.75, 0, 0.0, 100.0)
    assert not unknown.open_at(0.0)
    assert unknown.open_at(100.0)
    known = ShareTimeline(0.0, 1000)
    known.add(0.25, 1000, 0.0, 100.0)
    assert not known.open_at(0.0)  # its memory is all held


def test_it_searches_fractions_on_the_shared_nodes_of_their_model_only():
    devices = gpus("a", 2) + shared("b", 1, model="H100") + shared("c", 1) + mig("m", {0: [MIG_1G]})
    index = SharedNodes(build_nodes(devices, 0.0))
    assert [node.name for node in index.nodes] == ["b", "c"]
    assert [node.name for node in index.of(_frac("x", 0.5))] == ["b", "c"]
    assert [node.name for node in index.of(_frac("x", 0.5, gpu_model="A100"))] == ["c"]
    assert index.of(_frac("x", 0.5, gpu_model="V100")) == []
    # And the pass places it there.
    lines = by_id(plan(state(devices, [_frac("h", 0.5, gpu_model="H100")]), FIFO))
    assert lines["h"].device_ids == ("b-s0",)


@pytest.mark.parametrize("windows", [(), (Window("4", "", 1000.0, 2000.0, ("n",)),)])
def test_it_packs_a_member_fraction_of_a_project_with_holds_on_the_shared_gpus_as_is(windows):
    # The project holds the node's whole GPU; its members' fractions still see the shared one as
    # it is: full until 900 (a tenant of another project), and a window from 1000 if there is one.
    devices = gpus("n", 1) + shared("n", 1, memory_mib=40000)
    tenant = alloc("t", ["n-s0"], end=900, share=1.0)
    hold = ProjectHold("h@0", "p", 0.0, 3600.0, ("n-g0",))
    pending = [_frac("x", 0.5, duration=200)]
    s = state(devices, pending, [tenant], holds=(hold,), windows=windows)
    line = by_id(plan(s, FIFO))["x"]
    assert (line.start, line.device_ids) == (2000.0 if windows else 900.0, ("n-s0",))
