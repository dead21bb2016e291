"""Holding each job to the CPU cores and host memory of its booking (docs/agent.md, "Cores and
memory").

A booking that names `cpus` and `memory_mib` (DesiredBooking) gets a cpuset of that many cores,
picked by the agent from the cores no other running job of the node holds, those on its GPUs'
NUMA nodes first; a CPU quota of that many cores' time; and a memory limit with no swap beyond
it. A job that goes over its memory is killed by its own limit (the kernel's out-of-memory
killer in its cgroup), never its neighbours; the agent reads the cgroup's OOM count before it
removes the cgroup and says so in the job's exit event (Event.oom_limit_mib).

Three ways, as the node has them (agents.confine picks with its --confine):
- cgroup v1: one cgroup per job in each of the cpuset, cpu and memory controllers
  (cpuset.cpus + cpuset.mems, cpu.cfs_quota_us / cpu.cfs_period_us, memory.limit_in_bytes and
  memory.memsw.limit_in_bytes where swap accounting is on); the job joins them before it execs
  (agents/jail.py).
- cgroup v2 without systemd: one cgroup per job (cpuset.cpus, cpuset.mems, cpu.max, memory.max,
  memory.swap.max), the controllers enabled down from the root.
- systemd: the job's scope gets AllowedCPUs=, AllowedMemoryNodes=, CPUQuota=, MemoryMax= and
  MemorySwapMax= (MemoryLimit= and no cpuset on cgroup v1, which systemd cannot pin there).

A booking without them (an older portal) runs as before: no limits.
"""

from __future__ import annotations

import logging
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

from agents.host import HostError, HostResources, format_cpulist, parse_cpulist
from agents.protocol import DesiredBooking, memory_text

log = logging.getLogger(__name__)

CGROUP_ROOT = Path("/sys/fs/cgroup")
CPU_PERIOD_US = 100_000
V1_CONTROLLERS = ("cpuset", "cpu", "memory")
_PARENT = "gpu-portal"


@dataclass(frozen=True)
class JobLimits:
    """One job's cores (`cpu_list`, with their NUMA nodes `mems`), CPU quota in cores (`cpus`)
    and memory limit; None: that one is not limited."""

    cpus: int | None
    cpu_list: tuple[int, ...]
    mems: tuple[int, ...]
    memory_mib: int | None

    def describe(self) -> str:
        parts = []
        if self.cpus is not None:
            parts.append(f"{self.cpus} CPU(s) on core(s) {format_cpulist(self.cpu_list)}")
        if self.memory_mib is not None:
            parts.append(f"{memory_text(self.memory_mib)} of memory")
        return " and ".join(parts)


def pick_cores(count: int, machine: HostResources, taken: set[int], near: set[int]) -> tuple:
    """`count` of the machine's cores: free ones on the NUMA nodes in `near` first (the job's
    GPUs'), then other free ones, then (more asked for than are free) held ones; all of them
    when it has fewer (a simulated node larger than this machine)."""
    local = [c for c in machine.cpus if machine.numa_of(c) in near]
    order = [c for c in local if c not in taken]
    order += [c for c in machine.cpus if c not in taken and c not in order]
    order += [c for c in machine.cpus if c not in order]
    return tuple(sorted(order[: max(1, count)]))


def job_limits(
    booking: DesiredBooking, machine: HostResources, taken: set[int], near: set[int]
) -> JobLimits | None:
    """The limits `booking` asks for on this machine (None: none, an older portal); raises
    HostError when its `cpu_list` is not a list of this machine's cores."""
    if booking.cpus is None and booking.memory_mib is None:
        return None
    cores: tuple[int, ...] = ()
    if booking.cpus is not None:
        if booking.cpu_list:
            cores = parse_cpulist(booking.cpu_list)
            if not cores or not set(cores) <= set(machine.cpus):
                raise HostError(
                    f"cpu_list {booking.cpu_list!r} is not a list of this node's cores "
                    f"({format_cpulist(machine.cpus)})"
                )
        else:
            cores = pick_cores(booking.cpus, machine, taken, near)
    mems = tuple(sorted({n for n in map(machine.numa_of, cores) if n is not None}))
    return JobLimits(booking.cpus, cores, mems, booking.memory_mib)


def job_env(booking: DesiredBooking) -> dict[str, str]:
    """What a job is told of its cores and memory; OMP_NUM_THREADS is a default it may set."""
    env = {}
    if booking.cpus is not None:
        env |= {"GPU_PORTAL_CPUS": str(booking.cpus), "OMP_NUM_THREADS": str(booking.cpus)}
    if booking.memory_mib is not None:
        env["GPU_PORTAL_MEMORY_MIB"] = str(booking.memory_mib)
    return env


# -- what each way writes ----------------------------------------------------------------------


def v1_writes(limits: JobLimits) -> list[tuple[str, str, str]]:
    """(controller, file, value) for cgroup v1, in the order they must be written (a cpuset
    needs its mems before a task joins; memsw may not go below memory's limit)."""
    writes = []
    if limits.cpu_list:
        writes.append(("cpuset", "cpuset.cpus", format_cpulist(limits.cpu_list)))
        if limits.mems:  # else the parent's, copied when the cgroup was made
            writes.append(("cpuset", "cpuset.mems", format_cpulist(limits.mems)))
    if limits.cpus is not None:
        writes.append(("cpu", "cpu.cfs_period_us", str(CPU_PERIOD_US)))
        writes.append(("cpu", "cpu.cfs_quota_us", str(limits.cpus * CPU_PERIOD_US)))
    if limits.memory_mib is not None:
        size = str(limits.memory_mib * 1024 * 1024)
        writes.append(("memory", "memory.limit_in_bytes", size))
        writes.append(("memory", "memory.memsw.limit_in_bytes", size))  # where swap is counted
    return writes


def v2_writes(limits: JobLimits) -> list[tuple[str, str]]:
    """(file, value) for the job's cgroup v2 directory."""
    writes = []
    if limits.cpu_list:
        writes.append(("cpuset.cpus", format_cpulist(limits.cpu_list)))
        if limits.mems:
            writes.append(("cpuset.mems", format_cpulist(limits.mems)))
    if limits.cpus is not None:
        writes.append(("cpu.max", f"{limits.cpus * CPU_PERIOD_US} {CPU_PERIOD_US}"))
    if limits.memory_mib is not None:
        writes.append(("memory.max", str(limits.memory_mib * 1024 * 1024)))
        writes.append(("memory.swap.max", "0"))
    return writes


def oci_options(limits: JobLimits | None) -> list[str]:
    """Podman's and Docker's `run` options for the same limits (no swap beyond the memory)."""
    if limits is None:
        return []
    options = [f"--cpuset-cpus={format_cpulist(limits.cpu_list)}"] if limits.cpu_list else []
    if limits.cpus is not None:
        options.append(f"--cpus={limits.cpus}")
    if limits.memory_mib is not None:
        size = limits.memory_mib * 1024 * 1024
        options += [f"--memory={size}b", f"--memory-swap={size}b"]
    return options


def systemd_properties(limits: JobLimits, v2: bool) -> list[str]:
    """`systemd-run -p` properties; on cgroup v1 systemd has no cpuset and says MemoryLimit=."""
    props = []
    if limits.cpu_list and v2:
        props.append(f"AllowedCPUs={format_cpulist(limits.cpu_list)}")
        if limits.mems:
            props.append(f"AllowedMemoryNodes={format_cpulist(limits.mems)}")
    if limits.cpus is not None:
        props.append(f"CPUQuota={limits.cpus * 100}%")
    if limits.memory_mib is not None:
        size = limits.memory_mib * 1024 * 1024
        props += [f"MemoryMax={size}", "MemorySwapMax=0"] if v2 else [f"MemoryLimit={size}"]
    return props


# -- the cgroups themselves --------------------------------------------------------------------


class CgroupLimits:
    """Per-job limit cgroups under ROOT/<controller>/gpu-portal/<agent>/ (v1) or
    ROOT/gpu-portal/<agent>/ (v2). `supported` names the controls this node has."""

    def __init__(self, root: Path = CGROUP_ROOT, agent: str = "agent") -> None:
        self.root = Path(root)
        self.agent = agent
        self.v2 = (self.root / "cgroup.controllers").exists()
        self.supported = self._supported()

    def _supported(self) -> dict[str, bool]:
        if self.v2:
            have = set(_read(self.root / "cgroup.controllers").split())
            return {c: c in have for c in V1_CONTROLLERS}
        return {c: (self.root / c / "tasks").exists() for c in V1_CONTROLLERS}

    @property
    def version(self) -> str:
        return "cgroup v2" if self.v2 else "cgroup v1"

    def unavailable(self) -> str | None:
        """Why no job can be limited here at all (None: some controls work)."""
        if os.geteuid() != 0:
            return "the agent is not root"
        if not any(self.supported.values()):
            return f"no cpuset, cpu or memory controller under {self.root}"
        return None

    def missing(self) -> str | None:
        """Why jobs cannot be limited here with every control (None: they can)."""
        if os.geteuid() != 0:
            return "the agent is not root"
        lacking = [c for c, ok in self.supported.items() if not ok]
        if len(lacking) == len(V1_CONTROLLERS):
            return f"no cpuset, cpu or memory controller under {self.root}"
        return f"no {', '.join(lacking)} controller under {self.root}" if lacking else None

    def homes(self) -> list[Path]:
        """This agent's directories that hold its jobs' limit cgroups."""
        if self.v2:
            return [self.root / _PARENT / safe_name(self.agent)]
        return [self.root / c / _PARENT / safe_name(self.agent) for c in self._controllers()]

    def _controllers(self) -> list[str]:
        return [c for c in V1_CONTROLLERS if self.supported[c]]

    def make(self, name: str, limits: JobLimits) -> list[Path]:
        """Make and fill the job's cgroup(s) named `name`; the directories it must join.
        Raises OSError (what was made is removed again)."""
        made: list[Path] = []
        try:
            if self.v2:
                group = self.root / _PARENT / safe_name(self.agent) / name
                self._v2_path(group)
                made.append(group)
                for file, value in v2_writes(limits):
                    if not self.supported[file.split(".")[0]]:
                        continue
                    if file == "memory.swap.max" and not (group / file).exists():
                        continue  # no swap accounting: no swap to limit
                    _write(group / file, value)
                return made
            for controller in self._controllers():
                group = self.root / controller / _PARENT / safe_name(self.agent) / name
                self._v1_path(controller, group)
                made.append(group)
            by_controller = {g.parts[len(self.root.parts)]: g for g in made}
            for controller, file, value in v1_writes(limits):
                group = by_controller.get(controller)
                if group is None or (
                    file.startswith("memory.memsw") and not (group / file).exists()
                ):
                    continue  # no such controller, or no swap accounting on this kernel
                _write(group / file, value)
        except OSError:
            release_groups(made)
            raise
        return made

    def _v1_path(self, controller: str, group: Path) -> None:
        # A new v1 cpuset starts empty, and no task may join an empty one: each level takes
        # its parent's cores and memory nodes (the job's own are written after).
        base = self.root / controller
        for level in [*reversed(group.relative_to(base).parents[:-1]), group.relative_to(base)]:
            path = base / level
            if not path.is_dir():
                path.mkdir()
            if controller == "cpuset":
                for file in ("cpuset.cpus", "cpuset.mems"):
                    if not _read(path / file).strip():
                        _write(path / file, _read(path.parent / file).strip())

    def _v2_path(self, group: Path) -> None:
        # Each level enables the controllers for the one below (no task lives in these).
        enable = " ".join(f"+{c}" for c in self._controllers())
        path = self.root
        for part in group.relative_to(self.root).parts:
            if enable:
                _write(path / "cgroup.subtree_control", enable)
            path = path / part
            if not path.is_dir():
                path.mkdir()

    def close(self) -> None:
        """On agent exit: drop this agent's directories that no job cgroup is left in."""
        for home in self.homes():
            try:
                home.rmdir()
            except OSError:
                pass  # jobs still run (they outlive the agent) or it was never made

    def sweep(self, keep: set[str]) -> int:
        """Remove this agent's job cgroups that no running job holds; how many went."""
        gone = 0
        for home in self.homes():
            for group in sorted(home.glob("booking-*")) if home.is_dir() else []:
                if str(group) not in keep and not cgroup_pids(group):
                    release_groups([group])
                    gone += 1
        return gone


def oom_killed(groups: list[Path], exit_code: int | None) -> bool:
    """Whether the out-of-memory killer killed a task of the job's memory cgroup: v1's
    memory.oom_control oom_kill (an older kernel without it: memory.failcnt with a SIGKILL),
    v2's memory.events oom_kill."""
    for group in groups:
        for file in ("memory.oom_control", "memory.events"):
            counts = _counts(group / file)
            if "oom_kill" in counts:
                if counts["oom_kill"] > 0:
                    return True
            elif file == "memory.oom_control" and counts:
                failed = _read(group / "memory.failcnt").strip()
                if failed.isdigit() and int(failed) > 0 and exit_code in (-9, 137):
                    return True
    return False


def systemd_oom_killed(unit: str) -> bool:
    """Whether systemd ended the job's scope for an OOM kill (its Result)."""
    try:
        shown = subprocess.run(
            ["systemctl", "show", "--property=Result", "--value", unit],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        log.warning("cannot ask systemd how %s ended: %s", unit, exc)
        return False
    return shown.stdout.strip() == "oom-kill"


def release_groups(groups: list[Path]) -> None:
    """Remove job cgroups (deepest first); what is left in them must be gone already."""
    for group in groups:
        try:
            group.rmdir()
        except FileNotFoundError:
            pass
        except OSError as exc:
            log.warning("could not remove %s: %s", group, exc)


def _counts(path: Path) -> dict[str, int]:
    counts = {}
    for line in _read(path).splitlines():
        name, _, value = line.partition(" ")
        if value.strip().isdigit():
            counts[name] = int(value)
    return counts


def cgroup_pids(group: Path) -> list[int]:
    """The processes in a cgroup (none when it is gone)."""
    return [int(p) for p in _read(group / "cgroup.procs").split() if p.isdigit()]


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def _write(path: Path, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def safe_name(name: str) -> str:
    """An agent's name as a cgroup directory's: letters, digits, -, _ and . (not leading)."""
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name).lstrip(".") or "agent"
