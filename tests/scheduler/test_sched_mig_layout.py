"""MIG layouts: NVIDIA's allowed profiles and placements per model, and the change-time rule."""

from __future__ import annotations

import pytest
from sched_factories import MIG_1G, MIG_3G, mig, req

from scheduler import Allocation, Policy, State, plan
from scheduler.mig_layout import (
    MODELS,
    LayoutError,
    MigChange,
    change_times,
    layout_validate,
    mig_model,
)
from scheduler.types import REASON_MIG_CHANGE, REASON_STARTING, REASONS

A100_80 = MODELS["A100-80GB"]


@pytest.mark.parametrize(
    ("model", "memory_mib", "key"),
    [
        ("A100-SXM4-40GB", 40960, "A100-40GB"),
        ("A100-SXM4-80GB", 81920, "A100-80GB"),
        ("A100-80GB", 81920, "A100-80GB"),
        ("H100 80GB HBM3", 81559, "H100-80GB"),
        ("H100 NVL", 95830, "H100-94GB"),
        ("H200", 143771, "H200-141GB"),
        ("A30", 24576, "A30-24GB"),
    ],
)
def test_it_knows_the_mig_table_of_each_model(model, memory_mib, key):
    assert mig_model(model, memory_mib).key == key


def test_it_has_no_mig_table_for_a_gpu_without_mig():
    assert mig_model("L40S", 46068) is None


@pytest.mark.parametrize(
    ("key", "layout", "starts"),
    [
        # NVIDIA's own examples: 3g+3g, 4g+2g+1g, 7x1g, 2g+1g+1g+3g, 7g; starts found when omitted.
        ("A100-80GB", [("3g.40gb", None), ("3g.40gb", None)], [0, 4]),
        ("A100-80GB", [("4g.40gb", 0), ("2g.20gb", 4), ("1g.10gb", 6)], [0, 4, 6]),
        ("A100-40GB", [("1g.5gb", None)] * 7, [0, 1, 2, 3, 4, 5, 6]),
        (
            "A100-80GB",
            [("3g.40gb", None), ("2g.20gb", None), ("1g.10gb", None), ("1g.10gb", None)],
            [0, 2, 3, 4],
        ),
        ("H100-80GB", [("7g.80gb", None)], [0]),
        ("H200-141GB", [("3g.71gb", 4), ("1g.35gb", 0), ("1g.18gb", 2)], [0, 2, 4]),
        ("H100-94GB", [("2g.24gb", None)] * 3, [0, 2, 4]),
        ("A30-24GB", [("2g.12gb", None), ("1g.6gb", None), ("1g.6gb", None)], [0, 2, 3]),
        ("A100-40GB", [("1g.10gb", None)] * 4, [0, 2, 4, 6]),
    ],
)
def test_it_places_a_layout_nvidia_allows(key, layout, starts):
    placed = layout_validate(MODELS[key], layout)
    assert [p.start for p in placed] == starts
    assert sorted(p.profile for p in placed) == sorted(name for name, _ in layout)


@pytest.mark.parametrize(
    ("key", "layout", "field", "reason"),
    [
        ("A100-80GB", [], "instances", "at least one instance"),
        ("A100-80GB", [("1g.10gb", None)] * 8, "instances", "at most 7 instances"),
        (
            "A100-80GB",
            [("5g.50gb", None)],
            "instances[0].profile",
            "not a MIG profile of A100-80GB",
        ),
        # A 40 GB profile name on the 80 GB card: the names follow the memory.
        ("A100-80GB", [("3g.20gb", None)], "instances[0].profile", "not a MIG profile"),
        ("A100-80GB", [("3g.40gb", 2)], "instances[0].start", "starts at 0, 4 on A100-80GB, not 2"),
        ("A100-80GB", [("2g.20gb", 0), ("2g.20gb", 6)], "instances[1].start", "not 6"),
        (
            "A100-80GB",
            [("4g.40gb", 0), ("3g.40gb", 0)],
            "instances[1].start",
            "overlaps instances[0] (4g.40gb at 0)",
        ),
        ("A100-80GB", [("3g.40gb", None)] * 3, "instances[2].profile", "at most 2 instance(s)"),
        ("A100-80GB", [("1g.10gb+me", None)] * 2, "instances[1].profile", "at most 1"),
        # 4g at 0 leaves 4-7: a 3g fits at 4, two 3g do not.
        (
            "A100-80GB",
            [("4g.40gb", None), ("2g.20gb", None), ("2g.20gb", None), ("1g.10gb", None)],
            "instances",
            "no placement",
        ),
        ("A100-80GB", [("7g.80gb", None), ("1g.10gb", None)], "instances", "no placement"),
        ("A30-24GB", [("4g.24gb", None), ("1g.6gb", None)], "instances", "no placement"),
        ("A30-24GB", [("1g.6gb", None)] * 5, "instances", "at most 4 instances"),
    ],
)
def test_it_refuses_a_layout_nvidia_does_not_allow_naming_the_instance(key, layout, field, reason):
    with pytest.raises(LayoutError) as refused:
        layout_validate(MODELS[key], layout)
    assert refused.value.field == field
    assert reason in refused.value.reason


def test_it_appends_the_mig_change_reason():
    # Appended after the reasons that were there before (their order is what pages show).
    assert REASON_MIG_CHANGE == "mig_change"
    assert REASONS.index(REASON_MIG_CHANGE) > REASONS.index("topology")


# -- the planning rule ---------------------------------------------------------------------

DEVICES = mig("m", {0: [MIG_3G, MIG_3G], 1: [MIG_1G] * 7})
CHANGE = MigChange("m-g0", "m/gpu0")


def _state(allocations=(), pending=(), changes=(CHANGE,)):
    return State(100.0, DEVICES, tuple(allocations), tuple(pending), mig_changes=tuple(changes))


def test_it_plans_the_change_when_the_last_slice_frees():
    busy = [
        Allocation("r1", ("m-g0-0",), 0.0, 400.0, "u", "p"),
        Allocation("r2", ("m-g0-1",), 0.0, 250.0, "u", "p"),
        Allocation("adv", ("m-g0-1",), 600.0, 900.0, "u", "p", running=False),
        Allocation("other", ("m-g1-0",), 0.0, 5000.0, "u", "p"),
    ]
    assert change_times(_state(busy)) == {"m-g0": 900.0}


def test_it_plans_the_change_now_on_an_idle_gpu():
    assert change_times(_state()) == {"m-g0": 100.0}


def test_it_plans_no_change_without_one():
    assert change_times(_state(changes=())) == {}


def test_it_starts_no_booking_across_the_change_time():
    busy = [Allocation("r1", ("m-g0-0",), 0.0, 400.0, "u", "p")]
    short, long = (
        req("short", mig_profile=MIG_3G, duration=200.0),
        req("long", mig_profile=MIG_3G, duration=500.0, submit=1.0),
    )
    result = plan(_state(busy, [short, long]), Policy())
    lines = {line.booking_id: line for line in result.planned}
    # m-g0-1 is free until the change at 400: the short one fits before it, the long one not.
    assert lines["short"].reason == REASON_STARTING
    assert lines["short"].device_ids == ("m-g0-1",)
    assert lines["long"].start is None
    assert lines["long"].reason == REASON_MIG_CHANGE
    assert "m/gpu0 changes its MIG layout at" in lines["long"].detail


def test_it_starts_the_same_booking_without_the_change():
    busy = [Allocation("r1", ("m-g0-0",), 0.0, 400.0, "u", "p")]
    result = plan(
        _state(busy, [req("long", mig_profile=MIG_3G, duration=500.0)], changes=()), Policy()
    )
    assert [s.booking_id for s in result.starts] == ["long"]


def test_it_names_the_change_when_free_slices_wait_for_it():
    # The 1g slices on m-g1 are busy; the ones asked for on a changing GPU are free but go away.
    devices = mig("m", {0: [MIG_1G] * 7, 1: [MIG_1G] * 7})
    busy = [Allocation(f"r{k}", (f"m-g1-{k}",), 0.0, 300.0, "u", "p") for k in range(7)]
    state = State(
        100.0, devices, tuple(busy), (req("q", mig_profile=MIG_1G),), mig_changes=(CHANGE,)
    )
    line = plan(state, Policy()).planned[0]
    assert line.start == 300.0  # on m-g1 once its slices free up, not on m-g0
    assert line.reason == REASON_MIG_CHANGE
    assert line.detail.startswith("m/gpu0 changes its MIG layout at 1970-01-01 00:01 UTC")


# -- proposals (MIG_AUTO_LAYOUT) -----------------------------------------------------------

from scheduler.mig_layout import propose_layouts  # noqa: E402

TABLES = {"m-g0": A100_80, "m-g1": A100_80}


def test_it_proposes_a_layout_for_a_profile_no_idle_gpu_offers_after_the_wait():
    old = req("q", mig_profile="2g.20gb", submit=100.0 - 4000)
    (proposal,) = propose_layouts(_state(pending=[old], changes=()), TABLES, wait_s=3600)
    assert proposal.gpu == "m-g0"
    assert proposal.profiles == ("2g.20gb", "2g.20gb", "2g.20gb", "1g.10gb")
    assert "waited 67 min for 2g.20gb" in proposal.reason


@pytest.mark.parametrize(
    ("profile", "age", "changes", "busy"),
    [
        ("2g.20gb", 100.0, (), ()),  # not waited long enough
        (MIG_1G, 4000.0, (), ()),  # an idle GPU (m-g1) offers it
        ("2g.20gb", 4000.0, (CHANGE, MigChange("m-g1")), ()),  # both GPUs change already
        ("2g.20gb", 4000.0, (), ("m-g0-0", "m-g1-0")),  # no idle GPU
    ],
)
def test_it_proposes_nothing_when_the_rule_does_not_hold(profile, age, changes, busy):
    allocations = [Allocation(f"r{d}", (d,), 0.0, 500.0, "u", "p") for d in busy]
    waiting = req("q", mig_profile=profile, submit=100.0 - age)
    assert propose_layouts(_state(allocations, [waiting], changes), TABLES, wait_s=3600) == ()
