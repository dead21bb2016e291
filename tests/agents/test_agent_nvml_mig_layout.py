"""agents/nvml.py's MIG layout change, against a fake pynvml that keeps GPU and compute
instances as a driver does: the NVML calls, their order and arguments are pinned."""

from __future__ import annotations

import ctypes
from types import SimpleNamespace

import pytest

from agents import protocol
from agents.backend import MigLayoutError
from agents.nvml import NvmlBackend

MIB = 1024 * 1024


class NVMLError(Exception):
    pass


class Placement(ctypes.Structure):
    _fields_ = [("start", ctypes.c_uint), ("size", ctypes.c_uint)]


# pynvml's GPU instance profile ids for NVML_GPU_INSTANCE_PROFILE_* on an A100-80GB.
_GI_IDS = {0: 19, 1: 14, 2: 9, 3: 5, 4: 0}
_SIZES = {19: (1, 1, 9728), 14: (2, 2, 19968), 9: (3, 4, 40192), 5: (4, 4, 40192), 0: (7, 8, 80896)}
_NAMES = {19: "1g.10gb", 14: "2g.20gb", 9: "3g.40gb", 5: "4g.40gb", 0: "7g.80gb"}


class DriverNvml:
    """One A100-80GB in MIG mode, 3g.40gb at 0 and at 4, as GPU instances with one compute
    instance each; records every call that changes them."""

    NVMLError = NVMLError
    NVML_DEVICE_MIG_ENABLE = 1
    NVML_TEMPERATURE_GPU = 0
    NVML_GPU_INSTANCE_PROFILE_1_SLICE = 0
    NVML_GPU_INSTANCE_PROFILE_2_SLICE = 1
    NVML_GPU_INSTANCE_PROFILE_3_SLICE = 2
    NVML_GPU_INSTANCE_PROFILE_4_SLICE = 3
    NVML_GPU_INSTANCE_PROFILE_7_SLICE = 4
    NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE = 0
    NVML_COMPUTE_INSTANCE_PROFILE_2_SLICE = 1
    NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE = 2
    NVML_COMPUTE_INSTANCE_PROFILE_4_SLICE = 3
    NVML_COMPUTE_INSTANCE_PROFILE_7_SLICE = 4
    NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED = 0
    c_nvmlGpuInstancePlacement_t = Placement

    def __init__(self, fail_on=None):
        self.calls = []
        self.fail_on = fail_on
        self.next_gi = 3
        # gi id -> (profile id, start); each GI has compute instance 0 while it lives.
        self.gis = {1: (9, 0), 2: (9, 4)}
        self.cis = {1: {0}, 2: {0}}

    def __getattr__(self, name):
        raise AttributeError(name)

    def _log(self, *call):
        self.calls.append(call)
        if self.fail_on == call[0]:
            raise NVMLError("Insufficient Resources")

    def nvmlInit(self):
        pass

    def nvmlShutdown(self):
        pass

    def nvmlDeviceGetCount(self):
        return 1

    def nvmlDeviceGetHandleByIndex(self, i):
        return ("gpu", i)

    def nvmlDeviceGetUUID(self, h):
        return "GPU-0" if h[0] == "gpu" else f"MIG-gi{h[1]}"

    def nvmlDeviceGetName(self, h):
        return "NVIDIA A100-SXM4-80GB"

    def nvmlDeviceGetMemoryInfo(self, h):
        return SimpleNamespace(total=80 * 1024 * MIB, used=0)

    def nvmlDeviceGetMigMode(self, h):
        return [1, 1]

    def nvmlDeviceGetMaxMigDeviceCount(self, h):
        return 7

    def nvmlDeviceGetMigDeviceHandleByIndex(self, h, i):
        live = sorted(gi for gi, cis in self.cis.items() if cis)
        if i >= len(live):
            raise NVMLError("Not Found")
        return ("mig", live[i])

    def nvmlDeviceGetAttributes(self, h):
        slices, _, memory = _SIZES[self.gis[h[1]][0]]
        return SimpleNamespace(gpuInstanceSliceCount=slices, memorySizeMB=memory)

    def nvmlDeviceGetGpuInstanceId(self, h):
        return h[1]

    def nvmlDeviceGetComputeInstanceId(self, h):
        return 0

    def nvmlDeviceGetGpuInstanceById(self, parent, gi_id):
        if gi_id not in self.gis:
            raise NVMLError("Not Found")
        return ("gi", gi_id)

    def nvmlGpuInstanceGetInfo(self, gi):
        profile, start = self.gis[gi[1]]
        size = _SIZES[profile][1]
        return SimpleNamespace(profileId=profile, placement=SimpleNamespace(start=start, size=size))

    def nvmlDeviceGetGpuInstanceProfileInfoById(self, parent, profile_id):
        return SimpleNamespace(name=f"MIG {_NAMES[profile_id]}")

    def nvmlGpuInstanceGetComputeInstanceById(self, gi, ci_id):
        return ("ci", gi[1], ci_id)

    def nvmlComputeInstanceDestroy(self, ci):
        self._log("nvmlComputeInstanceDestroy", ci)
        self.cis[ci[1]].discard(ci[2])

    def nvmlGpuInstanceDestroy(self, gi):
        self._log("nvmlGpuInstanceDestroy", gi)
        del self.gis[gi[1]]
        del self.cis[gi[1]]

    def nvmlDeviceGetGpuInstanceProfileInfo(self, parent, profile):
        return SimpleNamespace(id=_GI_IDS[profile])

    def nvmlDeviceCreateGpuInstanceWithPlacement(self, parent, profile_id, placement):
        p = placement._obj  # ctypes.byref: the driver reads the struct through the pointer
        self._log("nvmlDeviceCreateGpuInstanceWithPlacement", profile_id, p.start, p.size)
        gi = self.next_gi
        self.next_gi += 1
        self.gis[gi] = (profile_id, p.start)
        self.cis[gi] = set()
        return ("gi", gi)

    def nvmlGpuInstanceGetComputeInstanceProfileInfo(self, gi, profile, engines):
        return SimpleNamespace(id=100 + profile)

    def nvmlGpuInstanceCreateComputeInstance(self, gi, profile_id):
        self._log("nvmlGpuInstanceCreateComputeInstance", gi, profile_id)
        self.cis[gi[1]].add(0)
        return ("ci", gi[1], 0)


def _slots(*items):
    return [protocol.MigSlot(*item) for item in items]


NEW = _slots(
    ("4g.40gb", 0, 4, 4, "4_SLICE", 40960),
    ("2g.20gb", 4, 2, 2, "2_SLICE", 20480),
    ("1g.10gb", 6, 1, 1, "1_SLICE", 10240),
)


def test_it_destroys_the_old_instances_then_creates_the_new_ones_at_their_placements():
    nvml = DriverNvml()
    backend = NvmlBackend(nvml, proc_root="/nonexistent", sys_root="/nonexistent")
    assert [(m.profile, m.placement_start) for m in backend.discover()[0].mig_instances] == [
        ("3g.40gb", 0),
        ("3g.40gb", 4),
    ]
    backend.apply_mig_layout("GPU-0", NEW)
    assert nvml.calls == [
        ("nvmlComputeInstanceDestroy", ("ci", 1, 0)),
        ("nvmlGpuInstanceDestroy", ("gi", 1)),
        ("nvmlComputeInstanceDestroy", ("ci", 2, 0)),
        ("nvmlGpuInstanceDestroy", ("gi", 2)),
        ("nvmlDeviceCreateGpuInstanceWithPlacement", 5, 0, 4),
        ("nvmlGpuInstanceCreateComputeInstance", ("gi", 3), 103),
        ("nvmlDeviceCreateGpuInstanceWithPlacement", 14, 4, 2),
        ("nvmlGpuInstanceCreateComputeInstance", ("gi", 4), 101),
        ("nvmlDeviceCreateGpuInstanceWithPlacement", 19, 6, 1),
        ("nvmlGpuInstanceCreateComputeInstance", ("gi", 5), 100),
    ]
    found = backend.discover()[0].mig_instances
    assert [(m.uuid, m.profile, m.placement_start) for m in found] == [
        ("MIG-gi3", "4g.40gb", 0),
        ("MIG-gi4", "2g.20gb", 4),
        ("MIG-gi5", "1g.10gb", 6),
    ]
    assert backend.sample()[1].uuid == "MIG-gi3"


def test_it_names_the_nvml_call_that_failed_and_reports_what_is_left():
    nvml = DriverNvml(fail_on="nvmlDeviceCreateGpuInstanceWithPlacement")
    backend = NvmlBackend(nvml, proc_root="/nonexistent", sys_root="/nonexistent")
    with pytest.raises(MigLayoutError, match="nvmlDeviceCreateGpuInstanceWithPlacement failed"):
        backend.apply_mig_layout("GPU-0", NEW)
    # The old instances are gone, the new ones never came: the inventory says so.
    assert backend.discover()[0].mig_instances == []


def test_it_refuses_a_gpu_it_does_not_have():
    backend = NvmlBackend(DriverNvml(), proc_root="/nonexistent", sys_root="/nonexistent")
    with pytest.raises(MigLayoutError, match="no GPU GPU-9"):
        backend.apply_mig_layout("GPU-9", NEW)


def test_it_refuses_a_profile_this_pynvml_does_not_know_before_destroying_anything():
    nvml = DriverNvml()
    backend = NvmlBackend(nvml, proc_root="/nonexistent", sys_root="/nonexistent")
    odd = _slots(("1g.10gb+me", 0, 1, 1, "1_SLICE_REV1", 10240))
    with pytest.raises(MigLayoutError, match="NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1"):
        backend.apply_mig_layout("GPU-0", odd)
    assert nvml.calls == []
    assert len(backend.discover()[0].mig_instances) == 2
