"""Advance reservations placed at submission: best fit, whole nodes, MIG packing, overlap."""

from __future__ import annotations

import pytest

from scheduler.reserve import Hold, Slot, Wanted, clashes, reserve


def _node(node: int, count: int, first_gpu: int, model: str = "A100") -> tuple[Slot, ...]:
    return tuple(Slot(node, first_gpu + i, None, model) for i in range(count))


def _slices(node: int, gpu: int, migs: list[int], profile: str = "1g.10gb") -> tuple[Slot, ...]:
    return tuple(Slot(node, gpu, m, "A100", profile, 1 / 7) for m in migs)


def _busy(*gpu_ids: int, start: float = 0.0, end: float = 1000.0) -> tuple[Hold, ...]:
    return tuple(Hold(g, None, start, end) for g in gpu_ids)


# Node 1: GPUs 10-17, node 2: GPUs 20-27, node 3: GPUs 30-33.
CLUSTER = _node(1, 8, 10) + _node(2, 8, 20) + _node(3, 4, 30)


@pytest.mark.parametrize(
    ("gpus", "holds", "expected"),
    [
        # Best fit: the smallest node with room, lowest GPU ids on it.
        (2, (), [30, 31]),
        (4, (), [30, 31, 32, 33]),
        # The fullest node that still fits wins over emptier ones.
        (2, _busy(10, 11, 12, 13, 14), [15, 16]),
        # Equal free counts: the lowest node id.
        (6, (), [10, 11, 12, 13, 14, 15]),
        (2, _busy(30, 31, 32), [10, 11]),
        # Larger than any node: whole free nodes, largest first, the last one partly.
        (12, (), [10, 11, 12, 13, 14, 15, 16, 17, 20, 21, 22, 23]),
        (20, (), list(range(10, 18)) + list(range(20, 28)) + [30, 31, 32, 33]),
        # A node with one GPU taken is not whole: it is skipped.
        (12, _busy(20), list(range(10, 18)) + [30, 31, 32, 33]),
        # Not enough whole free nodes: refused.
        (13, _busy(20), []),
        (21, (), []),
        # Holds outside the window do not count; one overlapping by a second does.
        (8, _busy(10, start=200.0, end=300.0), list(range(10, 18))),
        (8, _busy(10, start=199.0, end=300.0), list(range(20, 28))),
        (8, _busy(10, start=-50.0, end=100.0), list(range(10, 18))),
        (8, _busy(10, start=-50.0, end=101.0), list(range(20, 28))),
    ],
)
def test_it_places_whole_gpus_by_best_fit_then_whole_nodes(gpus, holds, expected):
    wanted = Wanted(gpus=gpus, start=100.0, end=200.0)
    placement = reserve(wanted, CLUSTER, holds)
    assert [slot.gpu for slot in placement.slots] == expected


def test_it_counts_the_matching_devices_free_for_the_window():
    placement = reserve(Wanted(gpus=30, start=0.0, end=10.0), CLUSTER, _busy(10, 20, 30))
    assert placement.slots == () and placement.free == 17


def test_it_takes_only_the_asked_model():
    slots = _node(1, 8, 10, model="A100") + _node(2, 2, 20, model="H100")
    wanted = Wanted(gpus=1, start=0.0, end=10.0, gpu_model="A100")
    assert [s.gpu for s in reserve(wanted, slots, ()).slots] == [10]
    assert reserve(Wanted(gpus=3, start=0.0, end=10.0, gpu_model="H100"), slots, ()).slots == ()


@pytest.mark.parametrize(
    ("holds", "expected"),
    [
        # Nothing held: lowest node, GPU, instance.
        ((), (5, 50)),
        # The GPU with the most slices already held in the window is packed first.
        ((Hold(6, 61, 0.0, 10.0, 2 / 7),), (6, 62)),
        ((Hold(6, 61, 0.0, 10.0, 1 / 7), Hold(5, 51, 0.0, 10.0, 3 / 7)), (5, 50)),
        # A held instance is not free; holds outside the window neither pack nor block.
        ((Hold(5, 50, 0.0, 10.0, 1 / 7),), (5, 51)),
        ((Hold(6, 61, 10.0, 20.0, 2 / 7), Hold(5, 50, 10.0, 20.0, 1 / 7)), (5, 50)),
    ],
)
def test_it_packs_a_mig_slice_onto_the_gpu_most_in_use(holds, expected):
    slots = _slices(1, 5, [50, 51]) + _slices(1, 6, [62, 63]) + _slices(2, 7, [70], "3g.40gb")
    placement = reserve(Wanted(1, 0.0, 10.0, mig_profile="1g.10gb"), slots, holds)
    assert [(s.gpu, s.mig) for s in placement.slots] == [expected]


def test_it_refuses_a_mig_slice_when_every_matching_one_is_held():
    slots = _slices(1, 5, [50]) + _slices(2, 7, [70], "3g.40gb")
    placement = reserve(Wanted(1, 0.0, 10.0, mig_profile="1g.10gb"), slots, (Hold(5, 50, 5, 6),))
    assert placement.slots == () and placement.free == 0


def test_it_finds_the_earliest_hold_in_the_way_of_an_extension():
    mine = (Slot(1, 10), Slot(1, 5, 50, "A100", "1g.10gb"))
    holds = (
        Hold(10, None, 300.0, 400.0),
        Hold(5, 50, 150.0, 160.0),
        Hold(5, 51, 100.0, 200.0),  # another instance on the same GPU: not in the way
        Hold(11, None, 100.0, 200.0),  # another GPU
        Hold(10, None, 50.0, 100.0),  # ends when the extension begins
    )
    found = clashes(mine, holds, 100.0, 350.0)
    assert [(h.gpu, h.mig, h.start) for h in found] == [(5, 50, 150.0), (10, None, 300.0)]
    assert clashes(mine, holds, 100.0, 150.0) == ()


def test_it_skips_an_instance_sharing_compute_slices_with_a_held_one_of_another_layout():
    # The GPU was re-split: instance 40 (old layout, slices 0..2) is still held; of the new
    # layout's 2g instances 41 (0..1) and 42 (2..3) overlap it, 43 (4..5) does not.
    slots = tuple(
        Slot(1, 4, mig, "A100", "2g.20gb", 2 / 7, (first, first + 2))
        for mig, first in ((41, 0), (42, 2), (43, 4))
    )
    held = (Hold(4, 40, 0.0, 10.0, 3 / 7, compute=(0, 3)),)
    placement = reserve(Wanted(1, 0.0, 10.0, mig_profile="2g.20gb"), slots, held)
    assert [s.mig for s in placement.slots] == [43] and placement.free == 1


TWO = _node(1, 2, 10)  # one node of GPUs 10 and 11


@pytest.mark.parametrize(
    ("case", "gpus", "holds", "until", "start"),
    [
        ("free as asked", 2, (), 5000, 100),
        ("after the one hold in the way", 2, _busy(10, start=0, end=700), 5000, 700),
        # One GPU frees at 400, the other at 900: two GPUs for 100 s first fit at 900.
        ("after the last of two", 2, _busy(10, end=400) + _busy(11, end=900), 5000, 900),
        ("one GPU, the first to free", 1, _busy(10, end=400) + _busy(11, end=900), 5000, 400),
        # A gap too short for the window (free 300-350, then held again): the next end.
        (
            "not in a gap shorter than the window",
            1,
            _busy(10, end=300) + _busy(10, start=350, end=2000) + _busy(11, end=2500),
            5000,
            2000,
        ),
        ("none before the search ends", 2, _busy(10, end=9000), 5000, None),
    ],
)
def test_it_finds_the_next_window_of_the_same_length_that_fits(case, gpus, holds, until, start):
    from scheduler.reserve import next_window

    wanted = Wanted(gpus=gpus, start=100, end=200)
    assert next_window(wanted, TWO, holds, until=until) == start, case


# Cores and memory in a reservation's placement (issue 40): node 1 and node 2 have 64 cores and
# 512 GiB each for their 8 GPUs, node 3 32 cores and 256 GiB for its 4.
def _hosts(*holds, default_cpus=None):
    from scheduler.reserve import Hosts
    from scheduler.types import NodeResources, Policy

    capacities = {
        1: NodeResources(64, 512 * 1024, 8),
        2: NodeResources(64, 512 * 1024, 8),
        3: NodeResources(32, 256 * 1024, 4),
    }
    return Hosts(capacities, tuple(holds), Policy(default_cpus_per_gpu=default_cpus))


def _host_hold(node, cpus, memory_mib=1024, start=0.0, end=1000.0):
    from scheduler.reserve import HostHold

    return HostHold(node, start, end, cpus, memory_mib)


@pytest.mark.parametrize(
    ("wanted", "host_holds", "expected", "short"),
    [
        # The best-fit node (3) has the GPUs but 24 of its 32 cores are held: node 1 instead.
        (Wanted(2, 0.0, 100.0, cpus=16), [_host_hold(3, 24)], [10, 11], None),
        # A hold that ends before the window, or starts after it, takes nothing from it.
        (Wanted(2, 100.0, 200.0, cpus=16), [_host_hold(3, 24, end=100.0)], [30, 31], None),
        (Wanted(2, 0.0, 100.0, cpus=16), [_host_hold(3, 24, start=100.0)], [30, 31], None),
        # Two holds that never overlap in time are not added up.
        (
            Wanted(2, 0.0, 100.0, cpus=16),
            [_host_hold(3, 16, end=50.0), _host_hold(3, 16, start=50.0)],
            [30, 31],
            None,
        ),
        # Every node short of cores: nothing, and the reason says cores.
        (
            Wanted(2, 0.0, 100.0, cpus=40),
            [_host_hold(1, 30), _host_hold(2, 30)],
            [],
            "cpus",
        ),
        # Short of memory alone: the reason says memory.
        (
            Wanted(2, 0.0, 100.0, memory_mib=300 * 1024),
            [_host_hold(1, 1, 300 * 1024), _host_hold(2, 1, 300 * 1024)],
            [],
            "memory",
        ),
        # No ask: the node's share for the GPUs taken (2 of 4 on node 3: 16 of 32 cores), which
        # 17 cores held there leave no room for.
        (Wanted(2, 0.0, 100.0), [_host_hold(3, 17)], [10, 11], None),
        # Larger than a node: whole nodes, each with room for what it asks per node. Node 1
        # has 24 cores free, too few for 30: node 2 and node 3 (32 cores) hold the 12.
        (
            Wanted(12, 0.0, 100.0, cpus=30),
            [_host_hold(1, 40)],
            list(range(20, 28)) + list(range(30, 34)),
            None,
        ),
        # 40 per node: node 3 (32 cores) cannot, node 1 has 34 free: only node 2's 8 GPUs.
        (Wanted(12, 0.0, 100.0, cpus=40), [_host_hold(1, 30)], [], "cpus"),
    ],
)
def test_it_places_a_reservation_only_where_its_cores_and_memory_fit(
    wanted, host_holds, expected, short
):
    placed = reserve(wanted, CLUSTER, (), _hosts(*host_holds))
    assert [s.gpu for s in placed.slots] == expected
    assert placed.short == short


def test_it_places_a_slice_and_a_fraction_only_on_nodes_with_room():
    from scheduler.reserve import Hosts
    from scheduler.types import NodeResources

    slices = _slices(1, 10, [0, 1]) + _slices(2, 20, [0, 1])
    hosts = Hosts(
        {1: NodeResources(8, 1024, 1), 2: NodeResources(8, 1024, 1)},
        (_host_hold(1, 8, 10),),
    )
    placed = reserve(Wanted(0, 0.0, 100.0, "1g.10gb", cpus=2), slices, (), hosts)
    assert [(s.node, s.gpu) for s in placed.slots] == [(2, 20)]
    shared = (
        Slot(1, 10, None, "A100", shared=True, memory_mib=80000),
        Slot(2, 20, None, "A100", shared=True, memory_mib=80000),
    )
    placed = reserve(Wanted(0, 0.0, 100.0, gpu_fraction=0.25, cpus=2), shared, (), hosts)
    assert [s.gpu for s in placed.slots] == [20]
    # Without hosts (a site that counts GPUs alone) the first of them fits.
    assert [s.gpu for s in reserve(Wanted(0, 0.0, 100.0, gpu_fraction=0.25), shared, ()).slots] == [
        10
    ]


def test_it_offers_the_next_window_where_the_cores_free_up():
    from scheduler.reserve import next_window

    hosts = _hosts(_host_hold(1, 60, end=500.0), _host_hold(2, 60, end=300.0))
    wanted = Wanted(8, 0.0, 100.0, cpus=32)
    assert next_window(wanted, CLUSTER, (), until=10_000.0) == 0.0  # GPUs alone: now
    assert next_window(wanted, CLUSTER, (), until=10_000.0, hosts=hosts) == 300.0
