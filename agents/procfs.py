"""Small, cached readers of /proc: who runs a pid, since when, and which GPUs it was given."""

from __future__ import annotations

import functools
import os
import pwd
from dataclasses import dataclass

PROC = "/proc"

# An environ read right after fork may still show the parent's environment (before exec);
# re-reading young entries for a few seconds catches the exec without re-reading everyone.
_RECHECK_YOUNG_S = 5.0
_TICKS = os.sysconf("SC_CLK_TCK")
# The booking the agent launched a process for (agents.dispatch sets it in every job).
BOOKING_VAR = "GPU_PORTAL_BOOKING_ID"
# On simulated GPUs (agents.simulate) a process uses this many MiB of GPU memory, fixed for its
# life (docs/agent.md, "Simulated GPU memory"): a test job starts a process with it set.
SIM_MEMORY_VAR = "GPU_PORTAL_SIM_MEMORY_MIB"
_ENV_READ = ("CUDA_VISIBLE_DEVICES", BOOKING_VAR, SIM_MEMORY_VAR)


@dataclass(frozen=True)
class ProcStat:
    """The fields of /proc/<pid>/stat the agent uses."""

    state: str
    pgid: int
    tty_nr: int
    start_ticks: int


@dataclass(frozen=True)
class ProcInfo:
    """A live process as the agent sees it; `start_ticks` tells it apart from a reused pid."""

    pid: int
    start_ticks: int
    user: str | None
    name: str | None
    cuda_devices: frozenset[str]
    # From the environment it started with: the booking the agent launched it for
    # (GPU_PORTAL_BOOKING_ID), and the GPU memory it uses on simulated GPUs (SIM_MEMORY_VAR).
    booking_id: int | None = None
    sim_memory_mib: int | None = None


def _uptime_s() -> float:
    with open(f"{PROC}/uptime") as f:
        return float(f.read().split()[0])


def read_stat(pid: int) -> ProcStat | None:
    """Parse /proc/<pid>/stat, or None when the process is gone."""
    try:
        with open(f"{PROC}/{pid}/stat", "rb") as f:
            raw = f.read().decode(errors="replace")
    except OSError:
        return None
    # comm may hold spaces and parentheses; the fields after the last ')' are fixed.
    rest = raw[raw.rfind(")") + 2 :].split()
    return ProcStat(
        state=rest[0], pgid=int(rest[2]), tty_nr=int(rest[4]), start_ticks=int(rest[19])
    )


def is_alive(pid: int, start_ticks: int) -> bool:
    """True when `pid` still runs and is the same process that started at `start_ticks`."""
    stat = read_stat(pid)
    return stat is not None and stat.start_ticks == start_ticks and stat.state not in "ZX"


@functools.lru_cache(maxsize=1024)
def user_name(uid: int) -> str:
    """The login name of `uid`, or the number as text when no passwd entry exists."""
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def read_uid(pid: int) -> int | None:
    """The uid owning `pid` (its effective uid), or None when the process is gone."""
    try:
        return os.stat(f"{PROC}/{pid}").st_uid
    except OSError:
        return None


def read_comm(pid: int) -> str | None:
    """The command name of `pid` (what `ps -o comm` shows)."""
    try:
        with open(f"{PROC}/{pid}/comm", "rb") as f:
            return f.read().decode(errors="replace").strip()
    except OSError:
        return None


def read_environ(pid: int, names: tuple[str, ...]) -> dict[str, str]:
    """The values of `names` in the environment `pid` started with (those it has)."""
    try:
        with open(f"{PROC}/{pid}/environ", "rb") as f:
            environ = f.read()
    except OSError:
        return {}
    wanted, found = {name.encode() + b"=" for name in names}, {}
    for entry in environ.split(b"\0"):
        name, sep, value = entry.partition(b"=")
        if sep and name + b"=" in wanted:
            found[name.decode()] = value.decode(errors="replace")
    return found


def read_cuda_devices(pid: int) -> frozenset[str]:
    """The entries of CUDA_VISIBLE_DEVICES in the environment `pid` started with."""
    return _devices(read_environ(pid, ("CUDA_VISIBLE_DEVICES",)).get("CUDA_VISIBLE_DEVICES", ""))


def _devices(value: str) -> frozenset[str]:
    return frozenset(part.strip() for part in value.split(",") if part.strip())


def _whole(value: str | None, most: int = 2**31 - 1) -> int | None:
    # ASCII digits only, bounded: a process's environment is anyone's to write.
    if value is None or not value.isascii() or not value.isdigit() or len(value) > 10:
        return None
    number = int(value)
    return number if number <= most else None


def identify(pid: int) -> ProcInfo | None:
    """Read everything the agent wants to know about `pid` once, or None when it is gone."""
    stat = read_stat(pid)
    uid = read_uid(pid)
    if stat is None or uid is None:
        return None
    env = read_environ(pid, _ENV_READ)
    return ProcInfo(
        pid,
        stat.start_ticks,
        user_name(uid),
        read_comm(pid),
        _devices(env.get("CUDA_VISIBLE_DEVICES", "")),
        booking_id=_whole(env.get(BOOKING_VAR)),
        sim_memory_mib=_whole(env.get(SIM_MEMORY_VAR)),
    )


def tty_path(pid: int) -> str | None:
    """The terminal of `pid` as a /dev path: its controlling tty, else a tty on its stdin."""
    stat = read_stat(pid)
    if stat is None:
        return None
    major, minor = os.major(stat.tty_nr), os.minor(stat.tty_nr)
    if 136 <= major <= 143:  # Unix98 pseudo-terminals
        return f"/dev/pts/{(major - 136) * 256 + minor}"
    if major == 4 and 0 < minor < 64:
        return f"/dev/tty{minor}"
    # Daemonized (setsid) processes have no controlling tty but may still write to one.
    try:
        target = os.readlink(f"{PROC}/{pid}/fd/0")
    except OSError:
        return None
    return target if target.startswith(("/dev/pts/", "/dev/tty")) else None


class ProcTable:
    """All processes on this machine, cached per pid so a 1 Hz refresh stays cheap."""

    def __init__(self) -> None:
        self._entries: dict[int, ProcInfo] = {}
        self._settled: set[int] = set()  # pids old enough that their environ is final
        self._by_device: dict[str, list[ProcInfo]] = {}

    def refresh(self) -> None:
        """Forget exited pids, read new ones (and re-read those that may not have exec'd yet)."""
        pids = {int(name) for name in os.listdir(PROC) if name.isdigit()}
        for pid in self._entries.keys() - pids:
            del self._entries[pid]
        # A pid that exited and was reused between two refreshes would keep its old entry;
        # the kernel hands out all of pid_max before reusing one, so in a second that is rare.
        self._settled &= pids
        unsettled = pids - self._settled
        if unsettled:
            uptime_ticks = _uptime_s() * _TICKS
            for pid in unsettled:
                self._read(pid, uptime_ticks)
        self._index()

    def _read(self, pid: int, uptime_ticks: float) -> None:
        info = identify(pid)
        if info is None:
            self._entries.pop(pid, None)
            return
        self._entries[pid] = info
        if uptime_ticks - info.start_ticks > _RECHECK_YOUNG_S * _TICKS:
            self._settled.add(pid)

    def _index(self) -> None:
        self._by_device = {}
        for pid in sorted(self._entries):
            info = self._entries[pid]
            for uuid in info.cuda_devices:
                self._by_device.setdefault(uuid, []).append(info)

    def on_device(self, uuid: str) -> list[ProcInfo]:
        """The processes whose CUDA_VISIBLE_DEVICES names `uuid`, in pid order."""
        return self._by_device.get(uuid, [])
