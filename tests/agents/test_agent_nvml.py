"""agents/nvml.py's conversion code, against a fake pynvml module (no GPU here)."""

import json
import os
from pathlib import Path
from types import SimpleNamespace

from agents import protocol
from agents.nvml import NvmlBackend

MIB = 1024 * 1024


class NVMLError(Exception):
    pass


class FakeNvml:
    """Just enough of pynvml: one whole GPU and one GPU in MIG mode with two instances."""

    NVMLError = NVMLError
    NVML_DEVICE_MIG_ENABLE = 1
    NVML_TEMPERATURE_GPU = 0

    def __init__(self, profile_names=True):
        self.setters_called = []
        self.profile_names = profile_names
        self.shut_down = False

    def __getattr__(self, name):
        if "Set" in name:  # the agent is read-only: any setter is a bug
            self.setters_called.append(name)
        raise AttributeError(name)

    def _not_supported(self, *args):
        raise NVMLError("Not Supported")

    def nvmlInit(self):
        pass

    def nvmlShutdown(self):
        self.shut_down = True

    def nvmlDeviceGetCount(self):
        return 2

    def nvmlDeviceGetHandleByIndex(self, i):
        return ("gpu", i)

    def nvmlDeviceGetUUID(self, h):
        return (
            f"GPU-{h[1]}" if h[0] == "gpu" else f"MIG-{h[1]}-{h[2]}".encode()
        )  # old pynvml: bytes

    def nvmlDeviceGetName(self, h):
        return b"NVIDIA A100-SXM4-80GB"

    def nvmlDeviceGetMemoryInfo(self, h):
        total = 80 * 1024 if h[0] == "gpu" else 9728
        return SimpleNamespace(total=total * MIB, used=(512 if h[0] == "gpu" else 100) * MIB)

    def nvmlDeviceGetMigMode(self, h):
        if h[1] == 0:
            raise NVMLError("Not Supported")  # e.g. a GPU without MIG
        return [1, 1]

    def nvmlDeviceGetMaxMigDeviceCount(self, h):
        return 3

    def nvmlDeviceGetMigDeviceHandleByIndex(self, h, i):
        if i == 1:
            raise NVMLError("Not Found")  # an empty slot
        return ("mig", h[1], i)

    def nvmlDeviceGetAttributes(self, h):
        return SimpleNamespace(
            gpuInstanceSliceCount=1 if h[2] == 0 else 3, memorySizeMB=9728 if h[2] == 0 else 40192
        )

    def nvmlDeviceGetGpuInstanceId(self, h):
        if not self.profile_names:
            raise NVMLError("No Permission")
        return h[2] + 1

    def nvmlDeviceGetComputeInstanceId(self, h):
        return 0

    def nvmlDeviceGetMinorNumber(self, h):
        return 4 + h[1]  # minors need not follow the NVML index

    def nvmlDeviceGetGpuInstanceById(self, parent, gi_id):
        return ("gi", gi_id)

    def nvmlGpuInstanceGetInfo(self, gi):
        return SimpleNamespace(profileId=gi[1] + 10)

    def nvmlDeviceGetGpuInstanceProfileInfoById(self, parent, profile_id):
        return SimpleNamespace(name=b"MIG 1g.10gb" if profile_id == 11 else b"MIG 3g.40gb")

    def nvmlDeviceGetUtilizationRates(self, h):
        if h[0] == "mig" or h[1] == 1:
            raise NVMLError("Not Supported")
        return SimpleNamespace(gpu=37, memory=12)

    def nvmlDeviceGetTemperature(self, h, sensor):
        if h[0] == "mig":
            raise NVMLError("Not Supported")
        return 55

    def nvmlDeviceGetPowerUsage(self, h):
        if h[0] == "mig":
            raise NVMLError("Not Supported")
        return 212_500

    def nvmlDeviceGetTotalEnergyConsumption(self, h):
        if h[0] == "mig" or h[1] == 1:
            raise NVMLError("Not Supported")
        return 123_456_789

    def nvmlDeviceGetComputeRunningProcesses(self, h):
        me = SimpleNamespace(pid=os.getpid(), usedGpuMemory=300 * MIB)
        if h == ("gpu", 1) or h == ("mig", 1, 0):
            return [me]  # the parent of a MIG GPU lists its instances' processes too
        return []


def test_it_discovers_gpus_and_mig_instances():
    fake = FakeNvml()
    gpus = NvmlBackend(nvml=fake).discover()
    assert [(g.uuid, g.mig_mode, g.memory_total_mib) for g in gpus] == [
        ("GPU-0", False, 81920),
        ("GPU-1", True, 81920),
    ]
    assert gpus[0].model == "NVIDIA A100-SXM4-80GB"
    migs = gpus[1].mig_instances
    assert [(m.uuid, m.profile, m.slices, m.memory_total_mib) for m in migs] == [
        ("MIG-1-0", "1g.10gb", 1, 9728),
        ("MIG-1-2", "3g.40gb", 3, 40192),
    ]
    assert fake.setters_called == []


def test_it_names_the_device_nodes_a_job_on_a_gpu_or_a_mig_slice_needs(tmp_path):
    # As the driver lays out MIG capabilities: gpu<minor>/mig/gi<id>[/ci<id>]/access.
    caps = tmp_path / "driver/nvidia/capabilities/gpu5/mig"
    for rel, minor in (("gi1", 21), ("gi1/ci0", 22), ("gi3", 39), ("gi3/ci0", 40)):
        (caps / rel).mkdir(parents=True, exist_ok=True)
        (caps / rel / "access").write_text(f"DeviceFileMinor: {minor}\nDeviceFileMode: 292\n")
    backend = NvmlBackend(nvml=FakeNvml(), proc_root=str(tmp_path))
    assert backend.device_files(["GPU-0"]) == ["/dev/nvidia4"]
    assert backend.device_files(["MIG-1-0"]) == [
        "/dev/nvidia5",
        "/dev/nvidia-caps/nvidia-cap21",
        "/dev/nvidia-caps/nvidia-cap22",
    ]
    both = backend.device_files(["MIG-1-0", "MIG-1-2"])
    assert both.count("/dev/nvidia5") == 1 and "/dev/nvidia-caps/nvidia-cap40" in both
    assert backend.device_files(["GPU-unknown"]) == []


def test_it_derives_profile_names_when_nvml_will_not_say():
    migs = NvmlBackend(nvml=FakeNvml(profile_names=False)).discover()[1].mig_instances
    assert [m.profile for m in migs] == ["1g.10gb", "3g.40gb"]


def test_it_reads_fields_and_nulls_the_unsupported_ones(me):
    backend = NvmlBackend(nvml=FakeNvml())
    whole, mig_gpu, mig0, mig2 = backend.sample()
    assert (whole.utilization_gpu, whole.utilization_memory) == (37.0, 12.0)
    assert (whole.temperature_c, whole.power_w, whole.memory_used_mib) == (55.0, 212.5, 512)
    assert (whole.energy_mj, mig_gpu.energy_mj, mig0.energy_mj) == (123_456_789, None, None)
    assert mig_gpu.utilization_gpu is None and mig_gpu.temperature_c == 55.0
    assert mig0.uuid == "MIG-1-0"
    assert (mig0.utilization_gpu, mig0.temperature_c, mig0.power_w) == (None, None, None)
    assert mig0.memory_used_mib == 100
    (proc,) = mig0.processes
    assert (proc.pid, proc.used_memory_mib, proc.user) == (os.getpid(), 300, me)
    assert mig_gpu.processes == []  # reported once, on the instance it runs in
    assert mig2.processes == []
    backend.close()


class TopologyNvml(FakeNvml):
    """FakeNvml with NVLink: GPU 0 link 0 goes to GPU 1 (and back); other links are down or
    past the last one. ``switch``: link 0 goes to an NVSwitch instead."""

    NVML_NVLINK_MAX_LINKS = 4
    NVML_FEATURE_ENABLED = 1
    NVML_NVLINK_DEVICE_TYPE_SWITCH = 2

    def __init__(self, switch=False):
        super().__init__()
        self.switch = switch

    def nvmlDeviceGetPciInfo(self, h):
        return SimpleNamespace(busId=f"00000000:{0x10 + h[1]:02X}:00.0".encode())

    def nvmlDeviceGetNvLinkState(self, h, link):
        if link >= 2:
            raise NVMLError("Invalid Argument")  # past this GPU's last link
        return 1 if link == 0 else 0

    def nvmlDeviceGetNvLinkRemotePciInfo(self, h, link):
        if self.switch:
            return SimpleNamespace(busId="00000000:FF:00.0")
        return SimpleNamespace(busId=f"0000:{0x10 + 1 - h[1]:02x}:00.0")  # legacy form

    def nvmlDeviceGetNvLinkRemoteDeviceType(self, h, link):
        return self.NVML_NVLINK_DEVICE_TYPE_SWITCH

    def nvmlDeviceGetNumaNodeId(self, h):
        if h[1] == 1:
            raise NVMLError("Not Supported")  # an older driver: sysfs tells
        return 1


def test_it_reads_nvlink_peers_numa_nodes_and_bus_ids(tmp_path):
    numa = tmp_path / "bus" / "pci" / "devices" / "0000:11:00.0"
    numa.mkdir(parents=True)
    (numa / "numa_node").write_text("0\n")
    gpus = NvmlBackend(nvml=TopologyNvml(), sys_root=str(tmp_path)).discover()
    assert [(g.pci_bus_id, g.numa_node, g.nvlink_peers) for g in gpus] == [
        ("0000:10:00.0", 1, [1]),
        ("0000:11:00.0", 0, [0]),
    ]


def test_gpus_on_an_nvswitch_are_all_peers(tmp_path):
    gpus = NvmlBackend(nvml=TopologyNvml(switch=True), sys_root=str(tmp_path)).discover()
    assert [g.nvlink_peers for g in gpus] == [[1], [0]]
    assert [g.numa_node for g in gpus] == [1, None]  # no sysfs entry: unknown, not an error


def test_an_older_driver_reports_no_topology_rather_than_failing(tmp_path):
    gpus = NvmlBackend(nvml=FakeNvml(), sys_root=str(tmp_path)).discover()
    assert [(g.pci_bus_id, g.numa_node, g.nvlink_peers) for g in gpus] == [(None, None, [])] * 2


class OddNvml(TopologyNvml):
    """A driver with answers the protocol would refuse: they must read as unknown."""

    def nvmlDeviceGetPciInfo(self, h):
        return SimpleNamespace(busId="00000000:3B:00.0\x07" + "x" * 40)

    def nvmlDeviceGetNumaNodeId(self, h):
        return 5000

    def nvmlDeviceGetNvLinkRemoteDeviceType(self, h, link):
        return 0  # a GPU, whose bus id could not be read


def test_odd_driver_answers_read_as_unknown_so_the_register_still_passes(tmp_path):
    gpus = NvmlBackend(nvml=OddNvml(), sys_root=str(tmp_path)).discover()
    assert [(g.pci_bus_id, g.numa_node, g.nvlink_peers) for g in gpus] == [(None, None, [])] * 2
    body = protocol.to_json(protocol.RegisterRequest("n", "0.1", gpus))
    protocol.from_json(protocol.RegisterRequest, body, strict=True)  # the portal's own check


# -- per-process memory: the process-list calls, pinned against tests/agents/data/nvml_processes.json

PROCESS_CASES = json.loads((Path(__file__).parent / "data" / "nvml_processes.json").read_text())


class CodedNVMLError(NVMLError):
    """pynvml's NVMLError carries the NVML return code as `value`."""

    def __init__(self, value):
        super().__init__(value)
        self.value = value


class ProcessNvml(FakeNvml):
    """One whole GPU whose process-list functions answer as a fixture case says."""

    NVMLError = NVMLError

    def __init__(self, case):
        super().__init__()
        self.case = PROCESS_CASES[case]
        self.called = []

    def nvmlDeviceGetCount(self):
        return 1

    def __getattr__(self, name):
        if name not in self.case:
            return super().__getattr__(name)
        return lambda handle: self._answer(name)

    def _answer(self, name):
        self.called.append(name)
        answer = self.case[name]
        if isinstance(answer, dict):
            raise CodedNVMLError(answer["error"])
        pids = {"self": os.getpid(), "parent": os.getppid()}
        return [SimpleNamespace(**{**p, "pid": pids[p["pid"]]}) for p in answer]

    # Not FakeNvml's list: each case says which entry points this pynvml and driver have.
    nvmlDeviceGetComputeRunningProcesses = None


def _memory(case):
    fake = ProcessNvml(case)
    (reading,) = NvmlBackend(nvml=fake).sample()
    return {p.pid: p.used_memory_mib for p in reading.processes}, fake.called


def test_it_reads_each_processs_gpu_memory_through_the_newest_list():
    memory, called = _memory("r550_two_tenants")
    assert memory == {os.getpid(): 30720, os.getppid(): 10240}
    assert called == [
        "nvmlDeviceGetComputeRunningProcesses_v3",
        "nvmlDeviceGetMPSComputeRunningProcesses_v3",
    ]


def test_it_falls_back_to_v2_on_a_driver_without_the_v3_entry_point():
    memory, called = _memory("r470_no_v3_entry_point")
    assert memory == {os.getpid(): 20480}
    assert called == [
        "nvmlDeviceGetComputeRunningProcesses_v3",
        "nvmlDeviceGetComputeRunningProcesses_v2",
        "nvmlDeviceGetMPSComputeRunningProcesses_v3",
        "nvmlDeviceGetMPSComputeRunningProcesses_v2",
    ]


def test_it_lists_mps_clients_with_their_own_memory_beside_the_mps_server():
    memory, _ = _memory("r550_under_mps")
    assert memory == {os.getppid(): 33792, os.getpid(): 20480}


def test_a_driver_that_cannot_list_processes_reports_none_rather_than_failing():
    memory, called = _memory("not_supported")
    assert memory == {}
    assert "nvmlDeviceGetComputeRunningProcesses_v2" not in called  # NotSupported is final


def test_memory_nvml_cannot_give_reads_as_unknown_never_as_zero():
    memory, _ = _memory("memory_not_available")
    assert memory == {os.getpid(): None}
