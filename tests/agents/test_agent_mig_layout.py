"""The agent applies a MIG layout change when the portal asks and its GPU is free, then
registers again with the new instances and the result (simulated backend)."""

from __future__ import annotations

from datetime import timedelta

from agents import protocol

SPEC = "1xA100-80GB:mig=3g.40gb+3g.40gb"
LAYOUT = [
    {
        "profile": "4g.40gb",
        "start": 0,
        "slices": 4,
        "size": 4,
        "gi_profile": "4_SLICE",
        "memory_mib": 40960,
    },
    {
        "profile": "2g.20gb",
        "start": 4,
        "slices": 2,
        "size": 2,
        "gi_profile": "2_SLICE",
        "memory_mib": 20480,
    },
    {
        "profile": "1g.10gb",
        "start": 6,
        "slices": 1,
        "size": 1,
        "gi_profile": "1_SLICE",
        "memory_mib": 10240,
    },
]


def _registers(portal):
    return [body for _, path, body in portal.received if path == protocol.REGISTER_PATH]


def _ask(portal, gpu_uuid, layout=LAYOUT, change_id=7):
    portal.desired["mig_layouts"] = [
        {"change_id": change_id, "gpu_uuid": gpu_uuid, "instances": layout}
    ]
    portal.desired["generation"] += 1


def test_it_applies_a_new_layout_and_registers_the_new_instances(portal, make_agent):
    agent = make_agent(SPEC)
    agent.handle_one_cycle()
    gpu = _registers(portal)[0].gpus[0]
    old = {m.uuid for m in gpu.mig_instances}
    _ask(portal, gpu.uuid)
    agent._pull_requested = True
    for _ in range(3):
        agent.handle_one_cycle()
    last = _registers(portal)[-1]
    assert len(_registers(portal)) == 2
    new = last.gpus[0].mig_instances
    assert [(m.profile, m.placement_start, m.slices) for m in new] == [
        ("4g.40gb", 0, 4),
        ("2g.20gb", 4, 2),
        ("1g.10gb", 6, 1),
    ]
    assert old.isdisjoint(m.uuid for m in new)
    assert last.mig_changes == [protocol.MigChangeResult(7, True, "")]
    # Readings name the new instances, and the layout is tried once only.
    for _ in range(2):
        agent.handle_one_cycle()
    assert len(_registers(portal)) == 2
    readings = [b for _, p, b in portal.received if p == protocol.READINGS_PATH][-1]
    assert {m.uuid for m in new} <= {r.uuid for r in readings.readings}


def test_it_waits_while_a_booking_holds_a_slice_of_the_gpu(portal, make_agent):
    agent = make_agent(SPEC)
    agent.handle_one_cycle()
    gpu = _registers(portal)[0].gpus[0]
    portal.book(1, "nobody", [gpu.mig_instances[1].uuid], minutes=60)
    _ask(portal, gpu.uuid)
    agent._pull_requested = True
    agent.handle_one_cycle()
    agent.handle_one_cycle()
    assert len(_registers(portal)) == 1
    assert agent.backend.discover()[0].mig_instances == gpu.mig_instances
    # The booking ends: the change goes ahead.
    portal.desired["bookings"][0]["end"] = (protocol.utcnow() - timedelta(seconds=1)).isoformat()
    portal.desired["generation"] += 1
    agent._pull_requested = True
    for _ in range(3):
        agent.handle_one_cycle()
    assert _registers(portal)[-1].mig_changes[0].ok


def test_it_reports_a_layout_the_gpu_refuses_as_failed_and_keeps_the_old_one(portal, make_agent):
    agent = make_agent(SPEC)
    agent.handle_one_cycle()
    gpu = _registers(portal)[0].gpus[0]
    overlapping = [LAYOUT[0], {**LAYOUT[1], "start": 2}]
    _ask(portal, gpu.uuid, overlapping, change_id=9)
    agent._pull_requested = True
    for _ in range(3):
        agent.handle_one_cycle()
    last = _registers(portal)[-1]
    (result,) = last.mig_changes
    assert (result.change_id, result.ok) == (9, False)
    assert "2g.20gb at 2 overlaps 4g.40gb at 0" in result.detail
    assert last.gpus[0].mig_instances == gpu.mig_instances


def test_it_refuses_a_layout_for_a_gpu_not_in_mig_mode(portal, make_agent):
    agent = make_agent("1xH100-80GB")
    agent.handle_one_cycle()
    gpu = _registers(portal)[0].gpus[0]
    _ask(portal, gpu.uuid)
    agent._pull_requested = True
    for _ in range(3):
        agent.handle_one_cycle()
    (result,) = _registers(portal)[-1].mig_changes
    assert not result.ok and "not in MIG mode" in result.detail
