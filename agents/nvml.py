"""The real GPU backend, over NVML. The only module of agents/ that imports pynvml.

Read-only by rule: nothing here calls an NVML setter, except `apply_mig_layout`, which
destroys and creates MIG instances when the portal asks for a new layout (and only then).
Every field is read on its own, so a field NVML cannot give (NotSupported, NoPermission,
...) becomes None and the reading still goes out.
"""

from __future__ import annotations

import ctypes
import dataclasses
import math
import re
from typing import Any

from agents.backend import MigLayoutError
from agents.procfs import identify
from agents.protocol import (
    NUMA_NODE_MAX,
    DeviceReading,
    GpuInventory,
    MigInventory,
    MigSlot,
    ProcessReading,
)

try:
    import pynvml
except ImportError:  # the simulated backend works without nvidia-ml-py installed
    pynvml = None

_MIB = 1024 * 1024
# The process lists, newest entry point first: a driver older than the pynvml lacks the newer
# one (FunctionNotFound, or a version mismatch), an older pynvml the name. Under MPS the compute
# list shows the MPS server; the MPS list shows its clients, the jobs.
_PROCESS_LISTS = (
    (
        "nvmlDeviceGetComputeRunningProcesses_v3",
        "nvmlDeviceGetComputeRunningProcesses_v2",
        "nvmlDeviceGetComputeRunningProcesses",
    ),
    (
        "nvmlDeviceGetMPSComputeRunningProcesses_v3",
        "nvmlDeviceGetMPSComputeRunningProcesses_v2",
        "nvmlDeviceGetMPSComputeRunningProcesses",
    ),
)
_FUNCTION_NOT_FOUND = 13  # NVML_ERROR_FUNCTION_NOT_FOUND
_ARGUMENT_VERSION_MISMATCH = 25  # NVML_ERROR_ARGUMENT_VERSION_MISMATCH
_BUS_ID = re.compile(r"[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]")


class NvmlBackend:
    """The Backend interface over NVML; `nvml` is the pynvml module (tests pass a fake)."""

    def __init__(self, nvml: Any = None, proc_root: str = "/proc", sys_root: str = "/sys") -> None:
        self._nvml = nvml or pynvml
        self._proc_root = proc_root
        self._sys_root = sys_root
        self._nodes: dict[str, list[str]] = {}  # uuid -> the /dev nodes a job on it opens
        if self._nvml is None:
            raise RuntimeError("nvidia-ml-py is not installed: pip install 'gpu-portal[agent]'")
        self._nvml.nvmlInit()
        self._handles: dict[str, Any] = {}
        self._inventory = self._discover()

    def _read(self, fn_name: str, *args: Any) -> Any:
        # A function missing from an older pynvml is as unavailable as NotSupported.
        try:
            return getattr(self._nvml, fn_name)(*args)
        except (self._nvml.NVMLError, AttributeError):
            return None

    def discover(self) -> list[GpuInventory]:
        """The GPUs and MIG instances found at start or after the last `apply_mig_layout`."""
        return list(self._inventory)

    def _discover(self) -> list[GpuInventory]:
        gpus = [self._discover_gpu(i) for i in range(self._nvml.nvmlDeviceGetCount())]
        return self._with_topology(gpus)

    # -- topology: every call guarded, so an older driver gives "no topology", not an error --

    def _with_topology(self, gpus: list[GpuInventory]) -> list[GpuInventory]:
        """The GPUs with their PCI bus id, NUMA node and NVLink peers (indexes) where NVML
        (or sysfs, for the NUMA node) tells them."""
        buses = {gpu.index: self._bus_id(self._handles[gpu.uuid]) for gpu in gpus}
        by_bus = {bus: index for index, bus in buses.items() if bus}
        links = {gpu.index: self._nvlinks(self._handles[gpu.uuid], by_bus) for gpu in gpus}
        # GPUs on an NVSwitch reach each other through it: all of them are peers.
        fabric = {index for index, (_, switch) in links.items() if switch}
        placed = []
        for gpu in gpus:
            peers = links[gpu.index][0] | (fabric if gpu.index in fabric else set())
            peers.discard(gpu.index)
            placed.append(
                dataclasses.replace(
                    gpu,
                    pci_bus_id=buses[gpu.index],
                    numa_node=self._numa_node(self._handles[gpu.uuid], buses[gpu.index]),
                    nvlink_peers=sorted(peers),
                )
            )
        return placed

    def _bus_id(self, handle: Any) -> str | None:
        info = self._read("nvmlDeviceGetPciInfo", handle)
        return _bus(getattr(info, "busId", None)) if info is not None else None

    def _nvlinks(self, handle: Any, by_bus: dict[str, int]) -> tuple[set[int], bool]:
        """The GPU indexes this GPU has an active NVLink to, and whether one goes to a switch.
        NotSupported (no NVLink) or InvalidArgument (past its last link) read as no link."""
        nvml, peers, switch = self._nvml, set(), False
        enabled = getattr(nvml, "NVML_FEATURE_ENABLED", 1)
        switch_type = getattr(nvml, "NVML_NVLINK_DEVICE_TYPE_SWITCH", None)
        for link in range(getattr(nvml, "NVML_NVLINK_MAX_LINKS", 0)):
            if self._read("nvmlDeviceGetNvLinkState", handle, link) != enabled:
                continue
            remote = self._read("nvmlDeviceGetNvLinkRemotePciInfo", handle, link)
            bus = _bus(getattr(remote, "busId", None)) if remote is not None else None
            if bus in by_bus:
                peers.add(by_bus[bus])
            elif switch_type is not None:
                kind = self._read("nvmlDeviceGetNvLinkRemoteDeviceType", handle, link)
                switch = switch or kind == switch_type
        return peers, switch

    def _numa_node(self, handle: Any, bus: str | None) -> int | None:
        """NVML's NUMA node of the GPU (newer drivers), else the kernel's for its PCI device."""
        node = self._read("nvmlDeviceGetNumaNodeId", handle)
        if isinstance(node, int) and 0 <= node <= NUMA_NODE_MAX:
            return node
        if bus is None:
            return None
        try:
            with open(f"{self._sys_root}/bus/pci/devices/{bus}/numa_node") as f:
                node = int(f.read().strip())
        except (OSError, ValueError):
            return None
        return node if 0 <= node <= NUMA_NODE_MAX else None

    def _discover_gpu(self, index: int) -> GpuInventory:
        handle = self._nvml.nvmlDeviceGetHandleByIndex(index)
        uuid = _text(self._nvml.nvmlDeviceGetUUID(handle))
        self._handles[uuid] = handle
        minor = self._read("nvmlDeviceGetMinorNumber", handle)
        self._nodes[uuid] = [] if minor is None else [f"/dev/nvidia{minor}"]
        mode = self._read("nvmlDeviceGetMigMode", handle)
        mig_on = bool(mode) and mode[0] == self._nvml.NVML_DEVICE_MIG_ENABLE
        memory = self._read("nvmlDeviceGetMemoryInfo", handle)
        return GpuInventory(
            index=index,
            uuid=uuid,
            model=_text(self._read("nvmlDeviceGetName", handle) or "unknown"),
            memory_total_mib=memory.total // _MIB if memory else 0,
            mig_mode=mig_on,
            mig_instances=self._discover_migs(handle, minor) if mig_on else [],
        )

    def _discover_migs(self, parent: Any, minor: int | None) -> list[MigInventory]:
        instances = []
        for i in range(self._read("nvmlDeviceGetMaxMigDeviceCount", parent) or 0):
            # Empty slots raise NotFound: skip them, the layout may have holes.
            handle = self._read("nvmlDeviceGetMigDeviceHandleByIndex", parent, i)
            if handle is not None:
                instances.append(self._discover_mig(parent, handle, minor))
        return instances

    def _discover_mig(self, parent: Any, handle: Any, minor: int | None) -> MigInventory:
        uuid = _text(self._nvml.nvmlDeviceGetUUID(handle))
        self._handles[uuid] = handle
        self._nodes[uuid] = self._mig_nodes(handle, minor)
        attrs = self._read("nvmlDeviceGetAttributes", handle)
        slices = attrs.gpuInstanceSliceCount if attrs else 0
        memory_mib = int(attrs.memorySizeMB) if attrs else 0
        name = self._profile_name(parent, handle) or _derived_profile(slices, memory_mib)
        return MigInventory(uuid, name, slices, memory_mib, self._placement_start(parent, handle))

    def _placement_start(self, parent: Any, handle: Any) -> int | None:
        gi_id = self._read("nvmlDeviceGetGpuInstanceId", handle)
        gi = None if gi_id is None else self._read("nvmlDeviceGetGpuInstanceById", parent, gi_id)
        info = None if gi is None else self._read("nvmlGpuInstanceGetInfo", gi)
        start = getattr(getattr(info, "placement", None), "start", None)
        return start if isinstance(start, int) and 0 <= start <= 6 else None

    def _profile_name(self, parent: Any, handle: Any) -> str | None:
        # Needs privileges on many drivers; the caller derives a name when this gives None.
        gi_id = self._read("nvmlDeviceGetGpuInstanceId", handle)
        gi = None if gi_id is None else self._read("nvmlDeviceGetGpuInstanceById", parent, gi_id)
        info = None if gi is None else self._read("nvmlGpuInstanceGetInfo", gi)
        if info is None:
            return None
        profile = self._read("nvmlDeviceGetGpuInstanceProfileInfoById", parent, info.profileId)
        name = _text(getattr(profile, "name", b"")) if profile else ""
        return name.removeprefix("MIG ").strip() or None

    def _mig_nodes(self, handle: Any, minor: int | None) -> list[str]:
        # A MIG slice is opened through its parent's node plus the capability files of its GPU
        # instance and compute instance; the driver names their minors under /proc.
        gi = self._read("nvmlDeviceGetGpuInstanceId", handle)
        ci = self._read("nvmlDeviceGetComputeInstanceId", handle)
        if minor is None or gi is None or ci is None:
            return []
        caps = f"{self._proc_root}/driver/nvidia/capabilities/gpu{minor}/mig/gi{gi}"
        nodes = [f"/dev/nvidia{minor}"]
        for access in (f"{caps}/access", f"{caps}/ci{ci}/access"):
            cap_minor = _device_file_minor(access)
            if cap_minor is not None:
                nodes.append(f"/dev/nvidia-caps/nvidia-cap{cap_minor}")
        return nodes

    def host(self) -> None:
        """NVML knows no host resources: the agent reads the machine's (agents/host.py)."""
        return None

    def device_files(self, uuids: list[str]) -> list[str]:
        """/dev/nvidiaN per GPU; for a MIG slice its parent's node and its capability files."""
        files: list[str] = []
        for uuid in uuids:
            files += [node for node in self._nodes.get(uuid, []) if node not in files]
        return files

    def sample(self) -> list[DeviceReading]:
        """Read every GPU and MIG instance; unreadable fields are None."""
        readings = []
        for gpu in self._inventory:
            instances = [self._sample_mig(mig) for mig in gpu.mig_instances]
            readings.append(self._sample_gpu(gpu, instances))
            readings.extend(instances)
        return readings

    def _sample_gpu(self, gpu: GpuInventory, instances: list[DeviceReading]) -> DeviceReading:
        handle = self._handles[gpu.uuid]
        util = self._read("nvmlDeviceGetUtilizationRates", handle)
        temperature = self._read(
            "nvmlDeviceGetTemperature", handle, self._nvml.NVML_TEMPERATURE_GPU
        )
        power_mw = self._read("nvmlDeviceGetPowerUsage", handle)
        # On a MIG GPU the parent lists its instances' processes too; report each once.
        on_instances = {p.pid for r in instances for p in r.processes}
        processes = [p for p in self._processes(handle) if p.pid not in on_instances]
        return DeviceReading(
            uuid=gpu.uuid,
            utilization_gpu=None if util is None else float(util.gpu),
            utilization_memory=None if util is None else float(util.memory),
            memory_used_mib=self._memory_used(handle),
            memory_total_mib=gpu.memory_total_mib,
            temperature_c=None if temperature is None else float(temperature),
            power_w=None if power_mw is None else power_mw / 1000.0,
            processes=processes,
            energy_mj=self._read("nvmlDeviceGetTotalEnergyConsumption", handle),
        )

    def _sample_mig(self, mig: MigInventory) -> DeviceReading:
        # NVML gives no utilization, temperature or power per MIG instance: null, never 0.
        handle = self._handles[mig.uuid]
        processes = self._processes(handle)
        used = self._memory_used(handle)
        return DeviceReading(
            mig.uuid, None, None, used, mig.memory_total_mib, None, None, processes
        )

    def _memory_used(self, handle: Any) -> int | None:
        memory = self._read("nvmlDeviceGetMemoryInfo", handle)
        return None if memory is None else memory.used // _MIB

    def _processes(self, handle: Any) -> list[ProcessReading]:
        """The compute processes on a device with their memory; a pid on both lists (compute
        and MPS clients) once, with its memory where one list gives it."""
        used: dict[int, int | None] = {}
        for names in _PROCESS_LISTS:
            for proc in self._running(handle, names):
                memory = _mib(getattr(proc, "usedGpuMemory", None))
                if used.get(proc.pid) is None:
                    used[proc.pid] = memory
        readings = []
        for pid, memory in used.items():
            info = identify(pid)
            readings.append(
                ProcessReading(
                    pid=pid,
                    user=info.user if info else None,
                    used_memory_mib=memory,
                    name=info.name if info else None,
                )
            )
        return readings

    def _running(self, handle: Any, names: tuple[str, ...]) -> list[Any]:
        """The first of `names` this pynvml and driver have; [] when none says (NotSupported,
        NoPermission, or no such function anywhere)."""
        older = {_FUNCTION_NOT_FOUND, _ARGUMENT_VERSION_MISMATCH}
        for name in names:
            fn = getattr(self._nvml, name, None)
            if fn is None:
                continue
            try:
                return list(fn(handle) or [])
            except self._nvml.NVMLError as exc:
                if getattr(exc, "value", None) not in older:
                    return []
        return []

    # -- MIG layout changes: the one path that changes the GPUs ---------------------------

    def apply_mig_layout(self, gpu_uuid: str, instances: list[MigSlot]) -> None:
        """Destroy every compute and GPU instance of the GPU, then create each instance of the
        layout at its placement with one compute instance spanning it (NVIDIA's MIG user guide,
        "Getting Started with MIG"). A failure part-way raises MigLayoutError naming the NVML
        call; the inventory is read again either way, so the register reports what is there."""
        parent = self._handles.get(gpu_uuid)
        gpu = next((g for g in self._inventory if g.uuid == gpu_uuid), None)
        if parent is None or gpu is None:
            raise MigLayoutError(f"no GPU {gpu_uuid} on this node")
        if not gpu.mig_mode:
            raise MigLayoutError(f"GPU {gpu.index} is not in MIG mode")
        # Every constant first: a pynvml too old for a profile leaves the old layout standing.
        profiles = [self._profiles(slot) for slot in instances]
        try:
            for mig in gpu.mig_instances:
                self._destroy(parent, self._handles[mig.uuid])
            for slot, (gi_profile, ci_profile, shared) in zip(instances, profiles, strict=True):
                self._create(parent, slot, gi_profile, ci_profile, shared)
        finally:
            self._inventory = self._discover()

    def _call(self, fn_name: str, *args: Any) -> Any:
        try:
            return getattr(self._nvml, fn_name)(*args)
        except AttributeError:
            raise MigLayoutError(f"{fn_name} is not in this nvidia-ml-py") from None
        except self._nvml.NVMLError as exc:
            raise MigLayoutError(f"{fn_name} failed: {exc}") from exc

    def _destroy(self, parent: Any, handle: Any) -> None:
        gi = self._call(
            "nvmlDeviceGetGpuInstanceById", parent, self._call("nvmlDeviceGetGpuInstanceId", handle)
        )
        ci_id = self._call("nvmlDeviceGetComputeInstanceId", handle)
        ci = self._call("nvmlGpuInstanceGetComputeInstanceById", gi, ci_id)
        self._call("nvmlComputeInstanceDestroy", ci)
        self._call("nvmlGpuInstanceDestroy", gi)

    def _profiles(self, slot: MigSlot) -> tuple[int, int, int]:
        """NVML's GPU instance profile, compute instance profile and engine profile constants
        for one instance of a layout."""
        return (
            self._constant(f"NVML_GPU_INSTANCE_PROFILE_{slot.gi_profile}"),
            self._constant(f"NVML_COMPUTE_INSTANCE_PROFILE_{slot.slices}_SLICE"),
            self._constant("NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED"),
        )

    def _create(
        self, parent: Any, slot: MigSlot, gi_profile: int, ci_profile: int, shared: int
    ) -> None:
        nvml = self._nvml
        info = self._call("nvmlDeviceGetGpuInstanceProfileInfo", parent, gi_profile)
        placement = nvml.c_nvmlGpuInstancePlacement_t()
        placement.start, placement.size = slot.start, slot.size
        gi = self._call(
            "nvmlDeviceCreateGpuInstanceWithPlacement", parent, info.id, ctypes.byref(placement)
        )
        ci_info = self._call("nvmlGpuInstanceGetComputeInstanceProfileInfo", gi, ci_profile, shared)
        self._call("nvmlGpuInstanceCreateComputeInstance", gi, ci_info.id)

    def _constant(self, name: str) -> int:
        value = getattr(self._nvml, name, None)
        if not isinstance(value, int):
            raise MigLayoutError(f"{name} is not in this nvidia-ml-py")
        return value

    def close(self) -> None:
        """Shut NVML down."""
        self._read("nvmlShutdown")


def _mib(used: Any) -> int | None:
    # NVML reports "not available" as None (or a huge sentinel) under MIG and on WDDM.
    return used // _MIB if isinstance(used, int) and 0 <= used < 2**63 else None


def _device_file_minor(access_path: str) -> int | None:
    # /proc/driver/nvidia/capabilities/.../access holds "DeviceFileMinor: 12" among other lines.
    try:
        with open(access_path) as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "DeviceFileMinor":
                    return int(value)
    except (OSError, ValueError):
        return None
    return None


def _bus(value: str | bytes | None) -> str | None:
    """A PCI bus id as the kernel names it (0000:3b:00.0): NVML gives "00000000:3B:00.0".
    Anything else is unknown (None), so a strange driver answer cannot fail the register."""
    if not value:
        return None
    domain, _, rest = _text(value).strip().lower().rpartition(":")
    domain, _, bus = domain.rpartition(":")
    try:
        found = f"{int(domain or '0', 16):04x}:{bus}:{rest}"
    except ValueError:
        return None
    return found if _BUS_ID.fullmatch(found) else None


def _text(value: str | bytes) -> str:
    # Older pynvml versions return bytes, newer ones str.
    return value.decode() if isinstance(value, bytes) else value


def _derived_profile(slices: int, memory_mib: int) -> str:
    # NVIDIA's names round memory up to whole GB: 9728 MiB is the "1g.10gb" profile.
    return f"{slices}g.{math.ceil(memory_mib / 1024)}gb"
