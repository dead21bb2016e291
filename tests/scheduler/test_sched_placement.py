"""Placement rules: one node, whole nodes, MIG profiles, models (one per booking unless any will
do), node state, packing, coolness."""

from __future__ import annotations

from dataclasses import replace

import pytest
from sched_factories import MIG_1G, MIG_3G, alloc, by_id, gpus, mig, req, state

from scheduler import Device, Policy, plan
from scheduler.kept_walk import keep_walk
from scheduler.reserve import Slot, Wanted, reserve


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


# The one-model rule (placement.keeps_one_model): a request of 2 or more GPUs that names no
# model gets GPUs of one model, unless it says any model will do (mixed_models).
H100_A100_A100 = gpus("h", 8, "H100") + gpus("a", 8, "A100") + gpus("b", 8, "A100")
# One node of 2 H100 and 4 A100, one of 8 V100.
MIXED_NODE = (
    tuple(Device(f"m-g{i}", "m", "H100") for i in range(2))
    + tuple(Device(f"m-g{i}", "m", "A100") for i in range(2, 6))
    + gpus("v", 8, "V100")
)
B_BUSY = [alloc("x", [f"b-g{i}" for i in range(8)], 500)]


def _models(devices, device_ids) -> set[str]:
    model = {device.id: device.model for device in devices}
    return {model[device_id] for device_id in device_ids}


@pytest.mark.parametrize(
    ("devices", "busy", "request_", "start", "nodes", "reason"),
    [
        # Two nodes' worth with no model: both A100 nodes, never one H100 and one A100 node.
        (H100_A100_A100, [], req("r", gpus=16), 0, {"a", "b"}, "starting"),
        # ... even when that means waiting for b, with h and a free now.
        (H100_A100_A100, B_BUSY, req("r", gpus=16), 500, {"a", "b"}, "resources"),
        # Any model will do: h and a, now.
        (H100_A100_A100, B_BUSY, req("r", gpus=16, mixed_models=True), 0, {"h", "a"}, "starting"),
        # No 16 GPUs of one model without b: never, unless any model will do.
        (H100_A100_A100[:16], [], req("r", gpus=16), None, set(), "never"),
        (H100_A100_A100[:16], [], req("r", 16, mixed_models=True), 0, {"h", "a"}, "starting"),
        # A named model is one model already.
        (H100_A100_A100, B_BUSY, req("r", gpus=16, gpu_model="A100"), 500, {"a", "b"}, "resources"),
        # One node of several models: 4 GPUs of one of them (its A100), not 2 H100 + 2 A100...
        (MIXED_NODE, [], req("r", gpus=4), 0, {"m"}, "starting"),
        # ... 6 of one model only on v (which has 8 V100), where m has 6 GPUs of two models.
        (MIXED_NODE, [], req("r", gpus=6), 0, {"v"}, "starting"),
        (MIXED_NODE, [], req("r", gpus=6, mixed_models=True), 0, {"m"}, "starting"),
        # One GPU, or a MIG slice, keeps one model by itself.
        (H100_A100_A100, [], req("r", gpus=1), 0, {"a"}, "starting"),
    ],
)
def test_it_keeps_a_booking_on_one_model_unless_any_will_do(
    devices, busy, request_, start, nodes, reason
):
    line = by_id(plan(state(devices, [request_], busy), Policy()))["r"]
    assert (line.start, line.reason) == (start, reason)
    if start is not None:
        assert _nodes_of(line.device_ids) == nodes
        assert len(line.device_ids) == request_.gpus
    if start is not None and not request_.mixed_models:
        assert len(_models(devices, line.device_ids)) == 1


def test_the_estimate_walk_and_reservations_keep_one_model_by_the_same_rule():
    # The estimate's kept walk gives the line plan() gives (q holds 2 GPUs until 100).
    policy = Policy(protect_oldest=0)
    queued = state(H100_A100_A100, [req("q", gpus=2, submit=-5)], B_BUSY)
    kept = keep_walk(queued, policy, every=1)
    for request, start, nodes in (
        (req("r", gpus=16), 500, {"a", "b"}),
        (req("r", gpus=16, mixed_models=True), 100, {"h", "a"}),
    ):
        line = kept.line(request)
        whole = by_id(plan(replace(queued, pending=queued.pending + (request,)), policy))["r"]
        assert line == whole
        assert (line.start, _nodes_of(line.device_ids)) == (start, nodes)
    slots = tuple(
        Slot(i // 8, i, model=device.model) for i, device in enumerate(H100_A100_A100[:16])
    )
    assert reserve(Wanted(16, 0.0, 100.0), slots, ()).slots == ()
    both = reserve(Wanted(16, 0.0, 100.0, mixed_models=True), slots, ())
    assert {slot.model for slot in both.slots} == {"H100", "A100"}
    # A fixed window of 4 with no model: the fullest node of one model, not 2 + 2 of two.
    slots = tuple(Slot(0, i, model=model) for i, model in enumerate(["H100"] * 2 + ["A100"] * 3))
    assert {slot.model for slot in reserve(Wanted(3, 0.0, 1.0), slots, ()).slots} == {"A100"}


def test_it_preempts_for_one_model_rather_than_take_free_gpus_of_two():
    victims = [alloc("low", [f"b-g{i}" for i in range(8)], 9000, qos="low", preemptible=True)]
    urgent = req("r", gpus=16, qos="high", submit=-1000)
    result = plan(state(H100_A100_A100, [urgent], victims, now=0.0), Policy(preempt_grace_s=300))
    assert [p.booking_id for p in result.preemptions] == ["low"]
    line = by_id(result)["r"]
    assert (line.reason, _nodes_of(line.device_ids)) == ("preempting", {"a", "b"})
