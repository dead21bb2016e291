"""Placement rules: one node, whole nodes, MIG profiles, models, node state, packing, coolness."""

from __future__ import annotations

import pytest
from sched_factories import MIG_1G, MIG_3G, alloc, by_id, gpus, mig, req, state

from scheduler import Device, Policy, plan


def _nodes_of(device_ids):
    return {device_id.split("-")[0] for device_id in device_ids}


def test_it_keeps_a_request_that_fits_on_one_node_on_one_node():
    devices = gpus("a") + gpus("b")
    busy = [
        alloc("x", [f"a-g{i}" for i in range(4)], 500),
        alloc("y", [f"b-g{i}" for i in range(4)], 900),
    ]
    result = plan(state(devices, [req("r", gpus=6)], busy), Policy())
    line = by_id(result)["r"]
    assert line.start == 500  # waits for node a rather than splitting 4+2 now
    assert _nodes_of(line.device_ids) == {"a"}
    assert result.starts == ()


def test_it_gives_requests_larger_than_a_node_whole_nodes():
    devices = gpus("a") + gpus("b") + gpus("c")
    busy = [alloc("x", ["c-g0"], 300)]
    result = plan(state(devices, [req("big", gpus=12)]), Policy())
    assert len(result.starts[0].device_ids) == 16
    assert _nodes_of(result.starts[0].device_ids) in ({"a", "b"}, {"a", "c"}, {"b", "c"})
    result = plan(state(devices, [req("big", gpus=12)], busy), Policy())
    assert _nodes_of(result.starts[0].device_ids) == {"a", "b"}  # c is not whole


@pytest.mark.parametrize(
    ("profile", "expected_prefix"),
    [(MIG_3G, "m-g0-0"), (MIG_1G, "m-g1-")],
)
def test_it_places_mig_requests_on_instances_of_that_profile(profile, expected_prefix):
    devices = gpus("a", 2) + mig("m", {0: [MIG_3G, MIG_3G], 1: [MIG_1G] * 7})
    result = plan(state(devices, [req("r", mig_profile=profile)]), Policy())
    (start,) = result.starts
    assert start.device_ids[0].startswith(expected_prefix)


def test_it_never_puts_a_whole_gpu_request_on_a_mig_instance():
    devices = mig("m", {0: [MIG_3G, MIG_3G]})
    line = by_id(plan(state(devices, [req("r")]), Policy()))["r"]
    assert (line.start, line.reason) == (None, "never")


def test_it_honours_the_gpu_model_constraint():
    devices = gpus("a", 8, "A100") + gpus("h", 8, "H100")
    busy = [alloc("x", [f"h-g{i}" for i in range(8)], 700)]
    result = plan(
        state(devices, [req("r", gpu_model="H100"), req("s", gpu_model="V100")], busy), Policy()
    )
    lines = by_id(result)
    assert lines["r"].start == 700 and _nodes_of(lines["r"].device_ids) == {"h"}
    assert lines["r"].reason == "resources"
    assert lines["s"].reason == "never"


@pytest.mark.parametrize("node_state", ["down", "drain"])
def test_it_never_places_on_down_or_draining_nodes(node_state):
    devices = gpus("a", 8, state=node_state) + gpus("b", 4)
    result = plan(state(devices, [req("small", gpus=2), req("big", gpus=8)]), Policy())
    lines = by_id(result)
    assert _nodes_of(lines["small"].device_ids) == {"b"}
    assert lines["big"].start is None
    assert lines["big"].reason == "node_down"
    assert "a" in lines["big"].detail


def test_it_reports_node_down_when_only_the_up_nodes_are_busy():
    devices = gpus("a", 8, state="down") + gpus("b", 8)
    busy = [alloc("x", [f"b-g{i}" for i in range(8)], 400)]
    line = by_id(plan(state(devices, [req("r", gpus=2)], busy), Policy()))["r"]
    assert (line.start, line.reason) == (400, "node_down")


def test_it_packs_onto_the_fullest_node_that_fits():
    devices = gpus("a") + gpus("b") + gpus("c")
    busy = [alloc("x", [f"b-g{i}" for i in range(5)], 900), alloc("y", ["c-g0"], 900)]
    result = plan(state(devices, [req("r", gpus=2)], busy), Policy())
    assert _nodes_of(result.starts[0].device_ids) == {"b"}  # a stays whole


def test_it_packs_mig_instances_onto_an_already_used_gpu():
    devices = mig("m", {0: [MIG_1G] * 7, 1: [MIG_1G] * 7})
    busy = [alloc("x", ["m-g1-0"], 900)]
    result = plan(state(devices, [req("r", mig_profile=MIG_1G)], busy), Policy())
    assert result.starts[0].device_ids[0].startswith("m-g1-")  # g0 stays whole


def test_it_prefers_cooler_gpus_among_equal_choices():
    hot = gpus("a", 8, temps=[80.0] * 8)
    cool = gpus("b", 8, temps=[40.0, 35.0, 90.0, 30.0, 50.0, 60.0, 70.0, 45.0])
    result = plan(state(hot + cool, [req("r", gpus=2)]), Policy())
    assert result.starts[0].device_ids == ("b-g1", "b-g3")


def test_it_prefers_less_loaded_gpus_when_temperatures_tie():
    devices = tuple(
        Device(f"a-g{i}", "a", "A100", utilization=u) for i, u in enumerate([0.9, 0.1, 0.5])
    )
    result = plan(state(devices, [req("r")]), Policy())
    assert result.starts[0].device_ids == ("a-g1",)
