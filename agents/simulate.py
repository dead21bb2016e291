"""A simulated GPU backend, so the agent runs (and is tested) on machines without GPUs.

SPEC grammar (documented in docs/agent.md):

    SPEC  := GROUP ("," GROUP)* ("," HOST)* ["@" TOPOLOGY]
    GROUP := COUNT "x" MODEL "-" MEM "GB" [":mig=" MIG]
    HOST  := "cpus=" N | "mem=" SIZE        (SIZE: 512M, 1024G, 2T)
    MIG   := ITEM ("+" ITEM)*
    ITEM  := [N "x"] SLICES "g." GB "gb"
    TOPOLOGY := "cube-mesh" | "nvswitch" | "pcie"

HOST gives the node's CPU cores and host memory (each at most once; cpus at most 8192); without
them the agent reports this machine's own (agents/host.py).

TOPOLOGY (none: the node reports no topology, as agents did before it): "cube-mesh" is DGX-1's
8-GPU NVLink hybrid cube-mesh (two fully connected quads, 0-3 and 4-7, plus the links i <-> i+4:
no fully connected set of 8, and a fully connected set of 4 only on a quad); "nvswitch" links
every GPU to every other; "pcie" has no NVLink. The first half of the GPUs is on NUMA node 0, the
rest on NUMA node 1.

The simulated devices report as their processes the REAL processes of this machine
whose CUDA_VISIBLE_DEVICES names the device's UUID, so launching, killing and
foreign processes behave as they would on a GPU node.

Each such process uses the GPU memory its environment names in GPU_PORTAL_SIM_MEMORY_MIB
(agents.procfs.SIM_MEMORY_VAR; read when it starts, so fixed for its life), else a plausible
fixed amount (256 to 4096 MiB by its pid). A device's processes never use more than it has: in
pid order, a process gets at most what is left. So a test job uses 30 GiB with
`export GPU_PORTAL_SIM_MEMORY_MIB=30720; exec sleep 600`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import random
import re
import time
from dataclasses import dataclass

from agents import host
from agents.backend import MigLayoutError
from agents.procfs import ProcInfo, ProcTable
from agents.protocol import (
    CPUS_MAX,
    MAX_GPUS,
    DeviceReading,
    GpuInventory,
    MigInventory,
    MigSlot,
    ProcessReading,
)

MIG_SLICES = 7
# Digits are ASCII ([0-9]: \d takes other scripts' too); counts are measured before repeating.
_GROUP_RE = re.compile(r"([0-9]+)x([A-Za-z][A-Za-z0-9]*)-([0-9]+)GB(?::mig=(.*))?\Z", re.IGNORECASE)
_HOST_ITEM_RE = re.compile(
    r"\s*[A-Za-z_]+\s*="
)  # cpus=64, mem=1024G (a GPU group starts with a digit)
_MIG_ITEM_RE = re.compile(r"(?:([0-9]+)x)?([0-9])g\.([0-9]+)gb\Z", re.IGNORECASE)
_MAX_POWER_W = {"H100": 700.0, "H200": 700.0, "A100": 400.0, "L40S": 350.0}
_IDLE_POWER_W = 60.0


TOPOLOGIES = ("cube-mesh", "nvswitch", "pcie")


class SpecError(ValueError):
    """A --simulate SPEC that does not parse; the message says which part and why."""


@dataclass(frozen=True)
class MigProfile:
    """A MIG profile such as 3g.40gb: compute slices and memory."""

    name: str
    slices: int
    memory_mib: int


@dataclass(frozen=True)
class GpuSpec:
    """One simulated GPU: its model, memory and MIG layout (empty when MIG is off)."""

    model: str
    memory_mib: int
    mig: tuple[MigProfile, ...] = ()


@dataclass(frozen=True)
class Topology:
    """One simulated GPU's place on its node: PCI bus id, NUMA node, NVLink peers (indexes)."""

    pci_bus_id: str
    numa_node: int
    nvlink_peers: tuple[int, ...]


def parse_spec(spec: str) -> list[GpuSpec]:
    """Parse a SPEC into one GpuSpec per GPU, or raise SpecError naming the bad part."""
    groups, _, _ = spec.partition("@")
    if not groups.strip():
        raise SpecError("empty SPEC; expected e.g. 8xH100-80GB")
    gpus: list[GpuSpec] = []
    for group in groups.split(","):
        if not _HOST_ITEM_RE.match(group):  # cpus=, mem= are the host's (parse_host)
            gpus.extend(_parse_group(group.strip(), room=MAX_GPUS - len(gpus)))
    if not gpus:
        raise SpecError(f"no GPU in SPEC {spec!r}; expected e.g. 8xH100-80GB,cpus=112,mem=2T")
    return gpus


@dataclass(frozen=True)
class HostSpec:
    """The host part of a SPEC: CPU cores and memory; None where the SPEC names none."""

    cpus: int | None = None
    memory_mib: int | None = None


def parse_host(spec: str) -> HostSpec:
    """The SPEC's "cpus=N" and "mem=SIZE" items, or raise SpecError naming the bad one."""
    groups, _, _ = spec.partition("@")
    found: dict[str, int] = {}
    for item in groups.split(","):
        if not _HOST_ITEM_RE.match(item):
            continue
        key, _, value = item.strip().partition("=")
        key = key.strip().lower()
        if key not in ("cpus", "mem"):
            raise SpecError(f"bad item {item.strip()!r}: expected cpus=N or mem=SIZE (e.g. 1024G)")
        if key in found:
            raise SpecError(f"{key}= is given twice in SPEC {spec!r}")
        found[key] = _host_value(key, value.strip())
    return HostSpec(found.get("cpus"), found.get("mem"))


def _host_value(key: str, value: str) -> int:
    if key == "mem":
        try:
            return host.parse_size_mib(value, "mem=")
        except host.HostError as exc:
            raise SpecError(str(exc)) from None
    if not re.fullmatch(r"[0-9]{1,5}", value) or not 1 <= int(value) <= CPUS_MAX:
        raise SpecError(f"cpus={value!r}: a number of cores from 1 to {CPUS_MAX}")
    return int(value)


def parse_topology(spec: str) -> list[Topology] | None:
    """Each GPU's topology by the SPEC's "@TOPOLOGY" (None: none given), or raise SpecError."""
    groups, at, name = spec.partition("@")
    if not at:
        return None
    count = len(parse_spec(groups))
    name = name.strip().lower()
    if name not in TOPOLOGIES:
        raise SpecError(f"unknown topology {name!r}: expected one of {', '.join(TOPOLOGIES)}")
    if name == "cube-mesh" and count != 8:
        raise SpecError(f"the cube-mesh topology has 8 GPUs, not {count}")
    half = max(1, (count + 1) // 2)
    return [
        Topology(f"0000:{0x18 + i:02x}:00.0", i // half, _peers(name, i, count))
        for i in range(count)
    ]


def _peers(name: str, index: int, count: int) -> tuple[int, ...]:
    if name == "nvswitch":
        return tuple(j for j in range(count) if j != index)
    if name == "cube-mesh":
        quad = index // 4
        return tuple(j for j in range(8) if j != index and (j // 4 == quad or j == (index + 4) % 8))
    return ()


def _parse_group(group: str, *, room: int) -> list[GpuSpec]:
    match = _GROUP_RE.match(group)
    if match is None:
        raise SpecError(f"bad group {group!r}: expected COUNTxMODEL-MEMGB, e.g. 8xH100-80GB")
    count, model, gb, mig = int(match[1]), match[2].upper(), int(match[3]), match[4]
    if count < 1 or gb < 1:
        raise SpecError(f"bad group {group!r}: count and memory must be at least 1")
    if count > room:
        raise SpecError(f"bad group {group!r}: a node has at most {MAX_GPUS} GPUs")
    gpu = GpuSpec(f"{model}-{gb}GB", gb * 1024, _parse_mig(group, mig, gb) if mig else ())
    return [gpu] * count


def _parse_mig(group: str, mig: str, gpu_gb: int) -> tuple[MigProfile, ...]:
    profiles: list[MigProfile] = []
    for item in mig.split("+"):
        match = _MIG_ITEM_RE.match(item.strip())
        if match is None:
            raise SpecError(f"bad MIG profile {item!r} in {group!r}: expected e.g. 3g.40gb")
        repeat, slices, gb = int(match[1] or 1), int(match[2]), int(match[3])
        if repeat > MIG_SLICES:
            raise SpecError(f"MIG layout in {group!r} uses more than {MIG_SLICES} slices")
        profiles.extend([MigProfile(f"{slices}g.{gb}gb", slices, gb * 1024)] * repeat)
    if sum(p.slices for p in profiles) > MIG_SLICES:
        raise SpecError(f"MIG layout in {group!r} uses more than {MIG_SLICES} slices")
    if sum(p.memory_mib for p in profiles) > gpu_gb * 1024:
        raise SpecError(f"MIG layout in {group!r} uses more than the GPU's {gpu_gb} GB")
    return tuple(profiles)


def stable_uuid(prefix: str, *parts: object) -> str:
    """A UUID-shaped id that depends only on `parts`, so restarts report the same devices."""
    digest = hashlib.sha1(":".join(map(str, parts)).encode()).hexdigest()
    return f"{prefix}-{digest[:8]}-{digest[8:12]}-{digest[12:16]}-{digest[16:20]}-{digest[20:32]}"


class _Walk:
    """Utilization as a random walk pulled towards busy or idle; temperature lags behind it."""

    def __init__(self, rng: random.Random) -> None:
        self._rng = rng
        self.utilization = rng.uniform(0.0, 5.0)
        self.temperature = 30.0 + rng.uniform(0.0, 5.0)
        self.energy_mj = 0.0  # as NVML's counter: power integrated over the time sampled
        self._last_sample: float | None = None

    def add_energy(self, power_w: float) -> None:
        now = time.monotonic()
        if self._last_sample is not None:
            self.energy_mj += power_w * (now - self._last_sample) * 1000.0
        self._last_sample = now

    def step(self, busy: bool) -> None:
        target = 85.0 if busy else 2.0
        pulled = self.utilization + 0.3 * (target - self.utilization) + self._rng.gauss(0, 4)
        self.utilization = min(100.0, max(0.0, pulled))
        self.temperature += 0.2 * (30.0 + 0.5 * self.utilization - self.temperature)


class SimulatedBackend:
    """The Backend interface over GPUs described by a SPEC; deterministic for a given seed."""

    def __init__(
        self,
        spec: str,
        hostname: str,
        seed: int = 0,
        procs: ProcTable | None = None,
        site: str = "",
        device_dir: str | None = None,
    ):
        self._gpus = parse_spec(spec)
        self._topology = parse_topology(spec)
        self._host = parse_host(spec)
        # Simulated GPUs have no /dev nodes; a test may make some (mknod) to check confinement.
        self._device_dir = device_dir
        self._hostname = hostname
        # UUIDs depend on the site (one portal install) too: two demos on one machine must not
        # report the same devices, or each would see the other's jobs as its own or foreign.
        self._site = site
        self._procs = procs or ProcTable()
        rng = random.Random(f"{seed}:{hostname}")
        self._walks = [_Walk(rng) for _ in self._gpus]
        self._inventory = [self._inventory_of(i, gpu) for i, gpu in enumerate(self._gpus)]
        self._layouts = 0  # MIG layout changes applied (the new instances' UUIDs count them)

    def _inventory_of(self, index: int, gpu: GpuSpec) -> GpuInventory:
        instances = [
            MigInventory(
                stable_uuid("MIG", *self._site_parts(), index, j), p.name, p.slices, p.memory_mib
            )
            for j, p in enumerate(gpu.mig)
        ]
        uuid = stable_uuid("GPU", *self._site_parts(), index)
        place = self._topology[index] if self._topology else None
        return GpuInventory(
            index,
            uuid,
            f"NVIDIA {gpu.model}",
            gpu.memory_mib,
            bool(gpu.mig),
            instances,
            pci_bus_id=place.pci_bus_id if place else None,
            numa_node=place.numa_node if place else None,
            nvlink_peers=list(place.nvlink_peers) if place else [],
        )

    def _site_parts(self) -> tuple[str, ...]:
        # Without a site, the ids of earlier versions (hostname only), so existing nodes keep theirs.
        return (self._site, self._hostname) if self._site else (self._hostname,)

    def host(self) -> host.HostResources | None:
        """The cores and memory the SPEC names (both or neither: the machine's own, None);
        NUMA nodes as the simulated GPUs' topology has them."""
        if self._host.cpus is None and self._host.memory_mib is None:
            return None
        machine = host.read_machine() if None in (self._host.cpus, self._host.memory_mib) else None
        cpus = self._host.cpus or len(machine.cpus)
        memory = self._host.memory_mib or machine.memory_mib
        return host.simulated(cpus, memory, 2 if self._topology else 1)

    def discover(self) -> list[GpuInventory]:
        """The simulated inventory: the SPEC's on every start, with the MIG layouts applied since."""
        return list(self._inventory)

    def sample(self) -> list[DeviceReading]:
        """One reading per GPU and MIG instance; advances the random walks by one step."""
        self._procs.refresh()
        readings: list[DeviceReading] = []
        for gpu, walk in zip(self._inventory, self._walks, strict=True):
            readings.extend(self._sample_gpu(gpu, walk))
        return readings

    def _sample_gpu(self, gpu: GpuInventory, walk: _Walk) -> list[DeviceReading]:
        own = self._processes(gpu.uuid, gpu.memory_total_mib)
        instances = [self._sample_mig(mig.uuid, mig.memory_total_mib) for mig in gpu.mig_instances]
        walk.step(busy=bool(own) or any(r.processes for r in instances))
        used = _used(own) + sum(r.memory_used_mib or 0 for r in instances)
        # NVML refuses utilization on a GPU in MIG mode, so the simulator does too.
        util = None if gpu.mig_mode else round(walk.utilization, 1)
        max_power = _MAX_POWER_W.get(gpu.model.split()[-1].split("-")[0], 300.0)
        power_w = round(_IDLE_POWER_W + (max_power - _IDLE_POWER_W) * walk.utilization / 100, 1)
        walk.add_energy(power_w)
        whole = DeviceReading(
            uuid=gpu.uuid,
            utilization_gpu=util,
            utilization_memory=None if util is None else round(util * 0.6, 1),
            memory_used_mib=min(used, gpu.memory_total_mib),
            memory_total_mib=gpu.memory_total_mib,
            temperature_c=round(walk.temperature, 1),
            power_w=power_w,
            processes=own,
            energy_mj=int(walk.energy_mj),
        )
        return [whole, *instances]

    def _sample_mig(self, uuid: str, total_mib: int) -> DeviceReading:
        # NVML has no utilization, temperature or power per MIG instance: null, never 0.
        processes = self._processes(uuid, total_mib)
        return DeviceReading(uuid, None, None, _used(processes), total_mib, None, None, processes)

    def _processes(self, uuid: str, total_mib: int) -> list[ProcessReading]:
        readings, left = [], total_mib
        for info in self._procs.on_device(uuid):
            used = min(left, _plausible_memory(info))
            left -= used
            readings.append(ProcessReading(info.pid, info.user, used, info.name))
        return readings

    def device_files(self, uuids: list[str]) -> list[str]:
        """Under `device_dir`: nvidia<i> per GPU, plus nvidia-caps/gpu<i>-mig<j> per MIG
        instance (as a real MIG slice needs its parent's node and its capability files)."""
        if not self._device_dir:
            return []
        wanted, files = set(uuids), []
        for i, gpu in enumerate(self._inventory):
            slices = [j for j, mig in enumerate(gpu.mig_instances) if mig.uuid in wanted]
            if gpu.uuid in wanted or slices:
                files.append(f"{self._device_dir}/nvidia{i}")
            files += [f"{self._device_dir}/nvidia-caps/gpu{i}-mig{j}" for j in slices]
        return files

    def apply_mig_layout(self, gpu_uuid: str, instances: list[MigSlot]) -> None:
        """Give a simulated GPU a new MIG layout, refusing what NVML would: a GPU not in MIG
        mode, a slice a process still uses, instances that overlap or do not fit. The new
        instances get new UUIDs. A restarted simulated agent starts again from its SPEC."""
        index = next((i for i, g in enumerate(self._inventory) if g.uuid == gpu_uuid), None)
        if index is None:
            raise MigLayoutError(f"no GPU {gpu_uuid} on this node")
        gpu = self._inventory[index]
        if not gpu.mig_mode:
            raise MigLayoutError(f"GPU {index} is not in MIG mode")
        self._procs.refresh()
        busy = [mig.uuid for mig in gpu.mig_instances if self._procs.on_device(mig.uuid)]
        if busy:
            raise MigLayoutError(f"MIG instance {busy[0]} is in use by a process")
        _check_layout(instances, gpu.memory_total_mib)
        # New UUIDs every time, as a real driver's: the same layout applied again (or after a
        # restart) is new instances, not the retired ones back.
        self._layouts += 1
        applied = (time.time_ns(), self._layouts)
        new = [
            MigInventory(
                stable_uuid("MIG", *self._site_parts(), index, "layout", *applied, j),
                slot.profile,
                slot.slices,
                slot.memory_mib,
                placement_start=slot.start,
            )
            for j, slot in enumerate(instances)
        ]
        self._inventory[index] = dataclasses.replace(gpu, mig_instances=new)

    def close(self) -> None:
        """Nothing to release."""


def _check_layout(instances: list[MigSlot], memory_mib: int) -> None:
    """What the driver refuses: overlapping memory slices, more than the GPU holds."""
    if sum(slot.slices for slot in instances) > MIG_SLICES:
        raise MigLayoutError(f"the layout uses more than {MIG_SLICES} compute slices")
    if sum(slot.memory_mib for slot in instances) > memory_mib:
        raise MigLayoutError("the layout uses more memory than the GPU has")
    taken: list[MigSlot] = []
    for slot in instances:
        if slot.start + slot.size > MIG_SLICES + 1:
            raise MigLayoutError(f"{slot.profile} at {slot.start} runs past the last memory slice")
        for other in taken:
            if slot.start < other.start + other.size and other.start < slot.start + slot.size:
                raise MigLayoutError(
                    f"{slot.profile} at {slot.start} overlaps {other.profile} at {other.start}"
                )
        taken.append(slot)


def _plausible_memory(info: ProcInfo) -> int:
    if info.sim_memory_mib is not None:
        return info.sim_memory_mib  # what the process asked to use (the module's docstring)
    # Fixed per process so its memory does not jump between readings.
    return 256 * (1 + (info.pid * 2654435761 + info.start_ticks) % 16)


def _used(processes: list[ProcessReading]) -> int:
    return sum(p.used_memory_mib or 0 for p in processes)
