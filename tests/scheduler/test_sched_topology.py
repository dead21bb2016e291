"""Topology-aware placement: NVLink-connected sets, one NUMA domain, one network group, and a
start never later than without topology (docs/scheduling.md, Placement)."""

from __future__ import annotations

import math
import random
from dataclasses import replace

import pytest
from sched_factories import alloc, by_id, gpus, req, state

from scheduler import Device, Policy, plan
from scheduler.reserve import Hold, Slot, Wanted, reserve
from scheduler.topology import SUBSETS_MAX, best_set, describe

# DGX-1's hybrid cube-mesh: two fully connected quads (0-3, 4-7) and the links i <-> i+4.
# A fully connected set of 4 is one of the two quads; no set of 8 is fully connected.
CUBE_MESH = {
    i: {j for j in range(8) if j != i and (j // 4 == i // 4 or j == (i + 4) % 8)} for i in range(8)
}


def _numa(i: int) -> int:
    return i // 4


def cube_mesh(node: str, group: str = "") -> tuple[Device, ...]:
    """An 8-GPU NVLink node (cube-mesh), GPUs 0-3 on NUMA node 0 and 4-7 on NUMA node 1."""
    return tuple(
        Device(
            f"{node}-g{i}",
            node,
            "V100",
            links=tuple(f"{node}-g{j}" for j in sorted(CUBE_MESH[i])),
            numa=_numa(i),
            group=group,
        )
        for i in range(8)
    )


def pcie(node: str, group: str = "") -> tuple[Device, ...]:
    """An 8-GPU PCIe node (no NVLink), GPUs 0-3 on NUMA node 0 and 4-7 on NUMA node 1."""
    return tuple(Device(f"{node}-g{i}", node, "L40S", numa=_numa(i), group=group) for i in range(8))


def _busy(node: str, *indexes: int, end: float = 1000.0):
    return alloc(
        f"busy-{node}-{'-'.join(map(str, indexes))}", [f"{node}-g{i}" for i in indexes], end
    )


def _started(devices, request, busy=()) -> tuple[int, ...]:
    result = plan(state(devices, [request], busy), Policy())
    (start,) = result.starts
    return tuple(sorted(int(d.rsplit("-g", 1)[1]) for d in start.device_ids))


def _linked(chosen) -> int:
    return sum(1 for a in chosen for b in chosen if a < b and b in CUBE_MESH[a])


@pytest.mark.parametrize(
    ("busy", "count", "expected"),
    [
        # The one quad left free is fully connected; the lowest free ids (1-4) are not.
        ((0,), 4, (4, 5, 6, 7)),
        ((5,), 4, (0, 1, 2, 3)),
        # A linked pair on one NUMA node, not the lowest free ids 3 and 4 (no link).
        ((0, 1, 2), 2, (4, 5)),
        # A fully connected triple inside a quad.
        ((0, 4, 5), 3, (1, 2, 3)),
        # Everything free: the first quad (fully connected, one NUMA node).
        ((), 4, (0, 1, 2, 3)),
        ((), 2, (0, 1)),
    ],
)
def test_it_gives_a_fully_nvlink_connected_set_where_one_is_free(busy, count, expected):
    allocations = [_busy("n", *busy)] if busy else []
    chosen = _started(cube_mesh("n"), req("r", gpus=count), allocations)
    assert chosen == expected
    assert _linked(chosen) == count * (count - 1) // 2


def test_it_gives_the_tightest_set_when_no_fully_connected_one_is_free():
    # 0 and 5 busy: neither quad is whole; the best sets of 4 have 4 links (a quad has 6).
    chosen = _started(cube_mesh("n"), req("r", gpus=4), [_busy("n", 0, 5)])
    assert _linked(chosen) == 4
    assert chosen == (1, 2, 3, 6)  # the first of them in id order
    plain = tuple(range(1, 5))  # what the choice without topology takes: 3 links
    assert _linked(plain) == 3


def test_it_keeps_a_set_in_one_numa_domain_on_a_pcie_node():
    assert _started(pcie("p"), req("r", gpus=4), [_busy("p", 0, 1)]) == (4, 5, 6, 7)
    assert _started(pcie("p"), req("r", gpus=3), [_busy("p", 0, 5)]) == (1, 2, 3)


def test_it_spans_numa_domains_only_when_it_must():
    chosen = _started(pcie("p"), req("r", gpus=4), [_busy("p", 0, 1, 4)])
    assert chosen == (2, 3, 5, 6)


def test_it_leaves_nodes_without_topology_as_they_were():
    # Cooler GPUs first, then ids: the choice of a node that reports nothing.
    temps = [80, 30, 30, 80, 30, 30, 80, 80]
    devices = gpus("a", 8, temps=temps)
    assert _started(devices, req("r", gpus=4)) == (1, 2, 4, 5)


def test_it_prefers_the_cooler_of_equally_connected_sets():
    devices = tuple(
        replace(d, temperature_c=90.0 if i < 4 else 40.0) for i, d in enumerate(cube_mesh("n"))
    )
    assert _started(devices, req("r", gpus=4)) == (4, 5, 6, 7)


def test_it_prefers_the_better_connected_node_among_equal_fits():
    # Both nodes have exactly 4 free: the NVLink node's free quad beats the PCIe node's split.
    devices = pcie("a") + cube_mesh("b")
    busy = [_busy("a", 0, 1, 4, 5), _busy("b", 0, 1, 2, 3)]
    result = plan(state(devices, [req("r", gpus=4)], busy), Policy())
    assert result.starts[0].device_ids == ("b-g4", "b-g5", "b-g6", "b-g7")


def test_it_never_starts_later_than_without_topology():
    rng = random.Random(7)
    for _ in range(200):
        devices = cube_mesh("a") + pcie("b") + cube_mesh("c", "r1") + pcie("d", "r1")
        busy = [
            alloc(f"x{i}", [d.id], rng.choice([100.0, 300.0, 900.0]))
            for i, d in enumerate(devices)
            if rng.random() < 0.5
        ]
        request = req("r", gpus=rng.choice([2, 3, 4, 5, 8, 12, 16]), duration=rng.choice([50, 500]))
        plain = tuple(replace(d, links=(), numa=None, group="") for d in devices)
        with_topology = by_id(plan(state(devices, [request], busy), Policy()))["r"]
        without = by_id(plan(state(plain, [request], busy), Policy()))["r"]
        assert with_topology.start == without.start
        assert len(with_topology.device_ids) == len(without.device_ids)


def test_it_puts_a_multi_node_request_in_one_network_group():
    temps = {"a": 30.0, "b": 50.0, "c": 31.0, "d": 60.0}
    groups = {"a": "r1", "b": "r1", "c": "r2", "d": "r2"}

    def node(name):
        return tuple(replace(d, temperature_c=temps[name]) for d in cube_mesh(name, groups[name]))

    devices = node("a") + node("b") + node("c") + node("d")
    started = plan(state(devices, [req("r", gpus=16)]), Policy()).starts[0]
    assert {d.split("-")[0] for d in started.device_ids} == {"a", "b"}  # r1, the cooler group
    # Without groups the two coolest nodes, across racks.
    plain = tuple(replace(d, group="") for d in devices)
    started = plan(state(plain, [req("r", gpus=16)]), Policy()).starts[0]
    assert {d.split("-")[0] for d in started.device_ids} == {"a", "c"}


def test_it_takes_another_group_rather_than_a_later_start():
    devices = (
        cube_mesh("a", "r1") + cube_mesh("b", "r1") + cube_mesh("c", "r2") + cube_mesh("d", "r2")
    )
    # b is busy: r1 cannot hold 16 GPUs now, r2 can.
    line = by_id(plan(state(devices, [req("r", gpus=16)], [_busy("b", 0)]), Policy()))["r"]
    assert (line.start, {d.split("-")[0] for d in line.device_ids}) == (0.0, {"c", "d"})
    # b and d busy: no group can hold it now; it starts now across groups, not later in one.
    busy = [_busy("b", 0), _busy("d", 0)]
    line = by_id(plan(state(devices, [req("r", gpus=16)], busy), Policy()))["r"]
    assert (line.start, {d.split("-")[0] for d in line.device_ids}) == (0.0, {"a", "c"})


def _slots(node: int, first_gpu: int, links, numa) -> tuple[Slot, ...]:
    return tuple(
        Slot(
            node,
            first_gpu + i,
            None,
            "V100",
            links=tuple(first_gpu + j for j in sorted(links.get(i, ()))),
            numa=numa(i),
        )
        for i in range(8)
    )


@pytest.mark.parametrize(
    ("busy", "count"), [((0,), 4), ((0, 1, 2), 2), ((0, 5), 4), ((0, 4, 5), 3), ((), 2)]
)
def test_a_reservation_gets_the_same_set_as_the_allocation_pass(busy, count):
    slots = _slots(1, 10, CUBE_MESH, _numa)
    holds = tuple(Hold(10 + i, None, 0.0, 1000.0) for i in busy)
    placed = reserve(Wanted(count, 0.0, 500.0), slots, holds)
    reserved = tuple(s.gpu - 10 for s in placed.slots)
    allocations = [_busy("n", *busy)] if busy else []
    assert reserved == _started(cube_mesh("n"), req("r", gpus=count), allocations)


def test_a_reservation_on_a_pcie_node_stays_in_one_numa_domain():
    slots = _slots(1, 10, {}, _numa)
    holds = tuple(Hold(g, None, 0.0, 1000.0) for g in (10, 11))
    placed = reserve(Wanted(4, 0.0, 500.0), slots, holds)
    assert [s.gpu for s in placed.slots] == [14, 15, 16, 17]


def test_best_set_searches_large_nodes_greedily():
    # 16 GPUs, pairs (2k, 2k+1) linked: C(16, 8) subsets is past the exact search.
    links = {i: {i ^ 1} for i in range(16)}
    chosen = best_set(list(range(16)), 8, links, {i: i // 8 for i in range(16)})
    assert sorted(chosen) == list(range(8))
    assert best_set([3, 1, 2], 2, {}, {}) == (3, 1)  # no topology: the caller's order


# A 16-GPU node whose odd GPUs form one NVLink clique; GPU i is on NUMA node (i // 2) % 2 (odd
# GPUs alternate 0, 1, 0, 1, ...). Even GPUs have no links.
_ODD = [i for i in range(16) if i % 2]
_CLIQUE = {i: set(_ODD) - {i} for i in _ODD}
_ALTERNATING = {i: (i // 2) % 2 for i in range(16)}


@pytest.mark.parametrize(
    ("count", "expected"),
    [
        # The linked set is not where the caller's order begins: found from another seed, by
        # the links alone (8 of 16 is C(16, 8) = 12,870 subsets).
        (8, _ODD),
        # Any 4 of the clique are fully connected: the greedy keeps them on the seed's NUMA node.
        (4, [1, 5, 9, 13]),
    ],
)
def test_it_finds_the_linked_set_of_a_16_gpu_node_greedily(count, expected):
    assert math.comb(16, count) > SUBSETS_MAX  # past the exact search
    chosen = best_set(list(range(16)), count, _CLIQUE, _ALTERNATING)
    assert sorted(chosen) == expected


@pytest.mark.parametrize(
    ("members", "links", "expected"),
    [
        ([0, 1, 2, 3], CUBE_MESH, "4 GPUs, fully NVLink-connected, NUMA 0"),
        ([0, 1, 4, 5], CUBE_MESH, "4 GPUs, NVLink-connected (not all pairs), NUMA 0+1"),
        ([0, 1, 6, 7], {0: {1}, 6: {7}}, "4 GPUs, 2 NVLink groups, NUMA 0+1"),
        ([0, 1], {}, "2 GPUs, PCIe, NUMA 0"),
        ([3], {}, ""),
    ],
)
def test_it_describes_a_set(members, links, expected):
    assert describe(members, links, {i: _numa(i) for i in range(8)}) == expected


def test_a_multi_node_reservation_stays_in_one_network_group():
    def node(number: int, group: str) -> tuple[Slot, ...]:
        return tuple(Slot(number, number * 10 + i, None, "V100", group=group) for i in range(8))

    slots = node(1, "r1") + node(2, "r2") + node(3, "r1") + node(4, "r2")
    placed = reserve(Wanted(16, 0.0, 500.0), slots, ())
    assert {s.node for s in placed.slots} == {1, 3}  # without groups: nodes 1 and 2
    busy = (Hold(30, None, 0.0, 1000.0),)  # node 3 is not whole: r2 holds it
    placed = reserve(Wanted(16, 0.0, 500.0), slots, busy)
    assert {s.node for s in placed.slots} == {2, 4}
    busy += (Hold(40, None, 0.0, 1000.0),)  # no group can: whole nodes of both, as before
    placed = reserve(Wanted(16, 0.0, 500.0), slots, busy)
    assert {s.node for s in placed.slots} == {1, 2}


# The bounded wait for a better set (Policy.topology_wait_s): the oldest booking is protected by
# default and never waits, so these policies protect none.
def _waiting(wait: float) -> Policy:
    return Policy(topology_wait_s=wait, protect_oldest=0)


def _mesh_with_quad_free_at(t: float):
    # 0 busy long, 5 busy until t: now the best 4 have 4 links; at t the quad 4-7 is free.
    return cube_mesh("n"), [_busy("n", 0, end=1000.0), _busy("n", 5, end=t)]


def test_it_waits_for_a_fully_connected_set_within_the_site_bound():
    devices, busy = _mesh_with_quad_free_at(100.0)
    line = by_id(plan(state(devices, [req("r", gpus=4)], busy), _waiting(200.0)))["r"]
    assert (line.start, line.reason) == (100.0, "topology")
    assert line.device_ids == ("n-g4", "n-g5", "n-g6", "n-g7")
    assert "200 s" in line.detail


def test_it_never_waits_longer_than_the_site_bound():
    devices, busy = _mesh_with_quad_free_at(100.0)
    for policy in (_waiting(50.0), Policy(protect_oldest=0)):  # bound below the wait; no wait
        result = plan(state(devices, [req("r", gpus=4)], busy), policy)
        assert result.starts[0].device_ids == ("n-g1", "n-g2", "n-g3", "n-g6")


def test_a_protected_booking_never_waits_for_topology():
    devices, busy = _mesh_with_quad_free_at(100.0)
    result = plan(state(devices, [req("r", gpus=4)], busy), Policy(topology_wait_s=200.0))
    assert len(result.starts) == 1  # protect_oldest=1: the oldest keeps its earliest start


def test_the_wait_is_bounded_on_random_states():
    rng = random.Random(11)
    waits = 0
    for _ in range(150):
        devices = cube_mesh("a") + pcie("b") + cube_mesh("c")
        busy = [
            alloc(f"x{i}", [d.id], rng.choice([30.0, 100.0, 300.0, 900.0]))
            for i, d in enumerate(devices)
            if rng.random() < 0.4
        ]
        request = req("r", gpus=rng.choice([2, 3, 4, 6]), duration=rng.choice([50, 500]))
        wait = rng.choice([60.0, 250.0])
        waited = by_id(plan(state(devices, [request], busy), _waiting(wait)))["r"]
        plain = by_id(plan(state(devices, [request], busy), _waiting(0.0)))["r"]
        assert plain.start <= waited.start <= plain.start + wait
        assert waited.reason != "starvation"
        if waited.reason == "topology":
            assert plain.reason == "starting" and waited.start > plain.start
            waits += 1
    assert waits > 0  # the states do exercise the wait
