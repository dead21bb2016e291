"""The simulated backend: SPEC parsing, inventory, readings, real processes as GPU users."""

import time

import pytest

from agents.simulate import SimulatedBackend, SpecError, parse_spec
from tests.bounded import measured


def test_it_parses_whole_gpus():
    gpus = parse_spec("8xH100-80GB")
    assert len(gpus) == 8
    assert gpus[0].model == "H100-80GB"
    assert gpus[0].memory_mib == 80 * 1024
    assert gpus[0].mig == ()


def test_it_parses_mixed_groups_with_mig():
    gpus = parse_spec("4xA100-80GB,4xA100-80GB:mig=3g.40gb+2g.20gb+1g.10gb+1g.10gb")
    assert len(gpus) == 8
    assert [p.name for p in gpus[4].mig] == ["3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"]
    assert [p.slices for p in gpus[4].mig] == [3, 2, 1, 1]
    assert gpus[0].mig == ()


def test_it_expands_repeated_mig_profiles():
    gpus = parse_spec("2xA100-40GB:mig=7x1g.5gb")
    assert len(gpus) == 2
    assert [p.name for p in gpus[1].mig] == ["1g.5gb"] * 7


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("", "empty SPEC"),
        ("8H100-80GB", "bad group '8H100-80GB'"),
        ("8xH100", "bad group '8xH100'"),
        ("0xH100-80GB", "at least 1"),
        ("1xA100-80GB:mig=3g.40gb+4x1g.10gb+1g.10gb", "more than 7 slices"),
        ("1xA100-40GB:mig=2x3g.30gb", "more than the GPU's 40 GB"),
        ("1xA100-40GB:mig=3g40gb", "bad MIG profile '3g40gb'"),
    ],
)
def test_it_rejects_bad_specs_with_a_clear_error(spec, message):
    with pytest.raises(SpecError, match=message):
        parse_spec(spec)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("99999999999999999999xH100-80GB", "at most 64 GPUs"),
        ("60xH100-80GB,8xH100-80GB", "at most 64 GPUs"),
        ("1xA100-80GB:mig=99999999999999999999x1g.10gb", "more than 7 slices"),
        ("٨xH100-80GB", "bad group"),
        ("1xA100-80GB:mig=٣g.40gb", "bad MIG profile"),
    ],
)
def test_it_refuses_a_count_past_its_bound_before_repeating_it(spec, message):
    with measured() as cost, pytest.raises(SpecError, match=message):
        parse_spec(spec)
    assert cost.cheap(), cost


def test_it_discovers_stable_uuids_per_hostname():
    spec = "1xH100-80GB,1xA100-80GB:mig=3g.40gb+3g.40gb"
    first = SimulatedBackend(spec, "node-a").discover()
    again = SimulatedBackend(spec, "node-a").discover()
    other = SimulatedBackend(spec, "node-b").discover()
    assert first == again
    assert first[0].uuid != other[0].uuid
    assert first[0].uuid.startswith("GPU-") and len(first[0].uuid) == 40
    assert first[1].mig_mode and not first[0].mig_mode
    assert [m.profile for m in first[1].mig_instances] == ["3g.40gb", "3g.40gb"]
    assert first[1].mig_instances[0].uuid.startswith("MIG-")


def test_it_gives_each_portal_install_its_own_simulated_devices(spawn):
    spec = "1xA100-80GB:mig=3g.40gb"
    ours = SimulatedBackend(spec, "node-a", site="install-1")
    theirs = SimulatedBackend(spec, "node-a", site="install-2")
    (our_gpu,), (their_gpu,) = ours.discover(), theirs.discover()
    assert our_gpu.uuid != their_gpu.uuid
    assert our_gpu.mig_instances[0].uuid != their_gpu.mig_instances[0].uuid
    assert SimulatedBackend(spec, "node-a", site="install-1").discover() == [our_gpu]
    # A job of the other demo on this machine is neither ours nor a foreign process on ours.
    sleeper = spawn(["sleep", "30"], cuda_devices=their_gpu.mig_instances[0].uuid)
    assert all(r.processes == [] for r in ours.sample())
    assert [p.pid for p in theirs.sample()[1].processes] == [sleeper.pid]


def test_it_reports_mig_utilization_as_null_not_zero():
    backend = SimulatedBackend("1xA100-80GB:mig=3g.40gb+2g.20gb", "node-a")
    readings = backend.sample()
    assert [r.uuid[:3] for r in readings] == ["GPU", "MIG", "MIG"]
    for mig in readings[1:]:
        assert mig.utilization_gpu is None
        assert mig.utilization_memory is None
        assert mig.memory_used_mib == 0
        assert mig.memory_total_mib in (40 * 1024, 20 * 1024)


def test_it_is_deterministic_for_a_seed_and_changes_over_time():
    a = SimulatedBackend("2xH100-80GB", "node-a", seed=7)
    b = SimulatedBackend("2xH100-80GB", "node-a", seed=7)
    series_a = [a.sample()[0].utilization_gpu for _ in range(10)]
    series_b = [b.sample()[0].utilization_gpu for _ in range(10)]
    assert series_a == series_b
    assert len(set(series_a)) > 1


def test_it_reports_real_processes_that_were_given_the_device(spawn, me):
    backend = SimulatedBackend("2xH100-80GB", "node-a", seed=3)
    gpu0, gpu1 = (g.uuid for g in backend.discover())
    idle = [backend.sample()[1].utilization_gpu for _ in range(5)]
    sleeper = spawn(["sleep", "30"], cuda_devices=gpu1)
    readings = backend.sample()
    assert readings[0].processes == []
    (proc,) = readings[1].processes
    assert proc.pid == sleeper.pid
    assert proc.name == "sleep"
    assert proc.user == me
    assert readings[1].memory_used_mib == proc.used_memory_mib > 0
    busy = [backend.sample()[1].utilization_gpu for _ in range(10)]
    assert max(busy) > max(idle) + 30  # utilization rises while a process is on it
    sleeper.kill()
    sleeper.wait()
    time.sleep(0.05)
    assert backend.sample()[1].processes == []


def test_it_models_a_cube_mesh_nvlink_node():
    gpus = SimulatedBackend("8xV100-32GB@cube-mesh", "node-a").discover()
    peers = {g.index: set(g.nvlink_peers) for g in gpus}
    # Two fully connected quads plus the links i <-> i+4, symmetric.
    assert peers[0] == {1, 2, 3, 4} and peers[5] == {1, 4, 6, 7}
    assert all(i in peers[j] for i in peers for j in peers[i])
    assert not all(len(p) == 7 for p in peers.values())  # no fully connected set of 8
    assert [g.numa_node for g in gpus] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert len({g.pci_bus_id for g in gpus}) == 8 and gpus[0].pci_bus_id == "0000:18:00.0"


def test_it_models_a_pcie_node_with_two_numa_domains():
    gpus = SimulatedBackend("8xL40S-48GB@pcie", "node-p").discover()
    assert all(g.nvlink_peers == [] for g in gpus)
    assert [g.numa_node for g in gpus] == [0, 0, 0, 0, 1, 1, 1, 1]


def test_its_topology_keeps_the_devices_it_had():
    # Adding a topology to a SPEC must not replace the node's devices (UUIDs stay).
    plain = SimulatedBackend("8xH100-80GB", "node-a", site="s1").discover()
    linked = SimulatedBackend("8xH100-80GB@nvswitch", "node-a", site="s1").discover()
    assert [g.uuid for g in plain] == [g.uuid for g in linked]
    assert plain[0].nvlink_peers == [] and plain[0].numa_node is None
    assert linked[0].nvlink_peers == [1, 2, 3, 4, 5, 6, 7]


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("4xV100-32GB@cube-mesh", "cube-mesh topology has 8 GPUs, not 4"),
        ("8xV100-32GB@torus", "unknown topology 'torus'"),
    ],
)
def test_it_rejects_bad_topologies(spec, message):
    with pytest.raises(SpecError, match=message):
        SimulatedBackend(spec, "node-a")
