"""The node's host resources: the CPU cores and memory jobs may use (docs/agent.md, "Cores and
memory"). Standard library only; it reads and never writes.

The cores are those the agent itself may run on (os.sched_getaffinity) less the site-reserved
ones (--reserved-cpus: the lowest-numbered, where the system's interrupts and daemons usually
run); the memory is /proc/meminfo's MemTotal less --reserved-memory. sysfs tells which cores each
NUMA node has (/sys/devices/system/node/node<N>/cpulist), so a job's cores can sit next to its
GPUs. The simulated backend reports the cores and memory its SPEC names instead.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from agents.protocol import CPU_LIST_MAX, CPUS_MAX, UINT, NumaCpus

NODE_DIR = Path("/sys/devices/system/node")
MEMINFO = Path("/proc/meminfo")
# "64", "512M", "4G", "2T" (binary units; no unit: MiB); digits bounded before int().
_SIZE_RE = re.compile(r"([0-9]{1,12})([MGT]i?B?)?\Z", re.IGNORECASE)
_UNITS_MIB = {"": 1, "M": 1, "G": 1024, "T": 1024 * 1024}
_RANGE_RE = re.compile(r"([0-9]{1,5})(?:-([0-9]{1,5}))?\Z")


class HostError(ValueError):
    """A size, a cpulist or a reservation that cannot be taken; the message says why."""


@dataclass(frozen=True)
class HostResources:
    """Cores (their ids) and memory jobs may use, and the usable cores of each NUMA node."""

    cpus: tuple[int, ...]
    memory_mib: int
    numa: tuple[tuple[int, tuple[int, ...]], ...] = ()

    def numa_cpus(self) -> list[NumaCpus]:
        """The register request's `numa_cpus`: each NUMA node that has usable cores."""
        return [NumaCpus(node, format_cpulist(cores)) for node, cores in self.numa if cores]

    def numa_of(self, core: int) -> int | None:
        """The NUMA node `core` is on (None: not known)."""
        return next((node for node, cores in self.numa if core in cores), None)


def parse_size_mib(text: str, what: str = "size", *, low: int = 1) -> int:
    """A memory size ("64G", "512M", "2T", "4096": MiB) in MiB, at least `low`, at most what a
    node's column holds; HostError names `what` and the form otherwise."""
    match = _SIZE_RE.match(text.strip())
    if match is None:
        raise HostError(f"{what} {text!r}: write a size such as 512M, 64G or 2T")
    unit = (match[2] or "")[:1].upper()
    mib = int(match[1]) * _UNITS_MIB[unit]
    if mib < low:
        raise HostError(f"{what} {text!r}: at least {low} MiB")
    if mib > UINT[1]:
        raise HostError(f"{what} {text!r}: at most {UINT[1]} MiB")
    return mib


def parse_cpulist(text: str) -> tuple[int, ...]:
    """A cpulist as sysfs and cgroups write it ("0-3,8,10-11") as sorted core ids; bounded
    (CPU_LIST_MAX characters, ids below CPUS_MAX) before anything is expanded."""
    if len(text) > CPU_LIST_MAX:
        raise HostError(f"cpulist longer than {CPU_LIST_MAX} characters")
    cores: set[int] = set()
    for part in text.strip().split(",") if text.strip() else []:
        match = _RANGE_RE.match(part.strip())
        if match is None:
            raise HostError(f"cpulist {text!r}: {part!r} is not a core or a range of cores")
        low, high = int(match[1]), int(match[2] or match[1])
        if not low <= high < CPUS_MAX:
            raise HostError(f"cpulist {text!r}: {part!r} is not a range of cores below {CPUS_MAX}")
        cores.update(range(low, high + 1))  # each range is below CPUS_MAX long
    return tuple(sorted(cores))


def format_cpulist(cores) -> str:
    """Core ids as a cpulist: (0, 1, 2, 3, 8) -> "0-3,8"."""
    ordered, parts = sorted(set(cores)), []
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        parts.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(parts)


def read_machine(node_dir: Path = NODE_DIR, meminfo: Path = MEMINFO) -> HostResources:
    """This machine's cores (those the agent may run on), memory and NUMA nodes."""
    cores = tuple(sorted(os.sched_getaffinity(0)))
    return HostResources(cores, _mem_total_mib(meminfo), _numa(node_dir, set(cores)))


def _mem_total_mib(meminfo: Path) -> int:
    for line in meminfo.read_text().splitlines():
        name, _, value = line.partition(":")
        if name == "MemTotal":
            return int(value.split()[0]) // 1024  # kB
    raise HostError(f"{meminfo} has no MemTotal")


def _numa(node_dir: Path, usable: set[int]) -> tuple[tuple[int, tuple[int, ...]], ...]:
    found = []
    for entry in sorted(node_dir.glob("node[0-9]*")) if node_dir.is_dir() else []:
        try:
            cores = parse_cpulist((entry / "cpulist").read_text())
        except (OSError, HostError):
            continue  # a node without cores, or one sysfs does not describe
        found.append((int(entry.name[4:]), tuple(c for c in cores if c in usable)))
    return tuple(sorted(found))


def reserve(host: HostResources, *, cpus: int = 0, memory_mib: int = 0) -> HostResources:
    """What jobs may use once the site keeps `cpus` cores (the lowest-numbered) and
    `memory_mib` for the system; HostError when nothing would be left."""
    if cpus < 0 or memory_mib < 0:
        raise HostError("a reservation cannot be negative")
    if cpus >= len(host.cpus):
        raise HostError(
            f"--reserved-cpus {cpus} leaves no core for jobs (the node has {len(host.cpus)})"
        )
    if memory_mib >= host.memory_mib:
        raise HostError(
            f"--reserved-memory {memory_mib} MiB leaves no memory for jobs "
            f"(the node has {host.memory_mib} MiB)"
        )
    kept = set(host.cpus[:cpus])
    numa = tuple((node, tuple(c for c in cores if c not in kept)) for node, cores in host.numa)
    return HostResources(host.cpus[cpus:], host.memory_mib - memory_mib, numa)


def simulated(cpus: int, memory_mib: int, numa_nodes: int) -> HostResources:
    """A simulated node's resources: `cpus` cores split evenly over `numa_nodes` NUMA nodes
    (as the simulated GPUs are: the first half on node 0, the rest on node 1)."""
    cores = tuple(range(cpus))
    if numa_nodes < 2:
        return HostResources(cores, memory_mib, ((0, cores),))
    half = (cpus + 1) // 2
    return HostResources(cores, memory_mib, ((0, cores[:half]), (1, cores[half:])))
