"""Confining each job to the device nodes of its booking, so CUDA_VISIBLE_DEVICES is not all.

A job runs in a cgroup of its own whose device list is the standard pseudo devices (/dev/null,
/dev/zero, /dev/tty, ...), the NVIDIA control nodes (/dev/nvidiactl, /dev/nvidia-uvm) and the
booked devices' nodes (a whole GPU: /dev/nvidiaN; a MIG slice: its parent's node and the slice's
GPU- and compute-instance capability files). Opening any other GPU fails with EPERM, whatever the
job sets CUDA_VISIBLE_DEVICES to. The agent picks the way once at start (`--confine`):

- `systemd`: `systemd-run --scope` with `DevicePolicy=closed` and a `DeviceAllow=` per node. Works
  on cgroup v1 and v2 (on v2 systemd installs the eBPF device filter). Needs systemd as init.
- `cgroup`: the cgroup v1 devices controller, written directly (hosts and containers without
  systemd as init). The job joins its cgroup before it execs (agents/jail.py), so it never runs
  unconfined. cgroup v2 without systemd is not done by hand: its device filter is an eBPF program.
- `auto` (the default): `systemd`, else `cgroup`, else none: jobs run as before, with
  CUDA_VISIBLE_DEVICES only, and the log says why at start and in every launch event.
- `off`: none, on purpose.

Each way also holds a job to the cores and memory of its booking (agents/limits.py): the
systemd scope by its properties, the cgroup way by cgroups in the cpuset, cpu and memory
controllers the job joins with its devices cgroup; with no device confinement the job still
joins limit cgroups where the node has them (cgroup v1 or v2).

When a job ends, whatever it left in its cgroup is killed and the cgroup removed.
"""

from __future__ import annotations

import logging
import os
import secrets
import shutil
import stat
import sys
from dataclasses import dataclass
from pathlib import Path

from agents.handles import groups_of, handle_of, release
from agents.limits import CGROUP_ROOT, CgroupLimits, JobLimits, cgroup_pids, safe_name
from agents.limits import systemd_properties as limit_properties

log = logging.getLogger(__name__)

MODES = ("auto", "systemd", "cgroup", "off")
CGROUP_V1_DEVICES = Path("/sys/fs/cgroup/devices")
SYSTEMD_RUN_DIR = Path("/run/systemd/system")  # exists when systemd is the init (sd_booted)
JAIL = Path(__file__).with_name("jail.py")
_PARENT = "gpu-portal"

# What systemd's DevicePolicy=closed allows, as cgroup v1 rules: null, zero, full, random,
# urandom, tty, ptmx and the pseudo-terminals.
PSEUDO_DEVICE_RULES = (
    "c 1:3 rwm",
    "c 1:5 rwm",
    "c 1:7 rwm",
    "c 1:8 rwm",
    "c 1:9 rwm",
    "c 5:0 rwm",
    "c 5:2 rwm",
    "c 136:* rwm",
)
# Every CUDA process needs these besides its GPUs' own nodes; the ones present are allowed.
SHARED_NODES = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools")


class ConfinementError(RuntimeError):
    """A confinement that was asked for cannot be set up (at start, or for one job)."""


@dataclass(frozen=True)
class Launch:
    """What to run for one job: `argv` (already wrapped), who drops privileges, how to undo it."""

    argv: list[str]
    drop_privileges: bool  # True: Popen switches user itself; False: the wrapper does
    handle: str | None  # "cgroup:<dir>" or "systemd:<unit>", for release()
    note: str  # said in the job's "started" event


class NoConfinement:
    """Jobs see every GPU of the node; only CUDA_VISIBLE_DEVICES points them at theirs. They
    still join limit cgroups (`cgroups`) where the node has them and their booking has limits."""

    def __init__(self, reason: str, cgroups: CgroupLimits | None = None) -> None:
        self.reason = reason
        self.how = "none"
        self.cgroups = cgroups

    def wrap(
        self,
        booking_id: int,
        argv: list[str],
        account,
        nodes: list[str],
        limits: JobLimits | None = None,
    ) -> Launch:
        note = f"not confined: {self.reason}"
        if limits is None:
            return Launch(argv, True, None, note)
        name = f"booking-{booking_id}-{secrets.token_hex(3)}"
        groups, held = _limit_groups(self.cgroups, name, limits)
        if not groups:
            return Launch(argv, True, None, f"{note}; {held}")
        return Launch(
            [*_jail(groups, account), "--", *argv], False, handle_of(groups), f"{note}; {held}"
        )

    def sweep(self, keep: set[str]) -> int:
        """Remove this agent's limit cgroups that no running job holds."""
        return self.cgroups.sweep(groups_of(keep)) if self.cgroups else 0

    def close(self) -> None:
        if self.cgroups is not None:
            self.cgroups.close()


class SystemdScope:
    """A transient scope per job with DevicePolicy=closed and the booked nodes allowed, and
    its booking's cores and memory as the scope's properties (`v2`: the unified hierarchy)."""

    how = "systemd scope"

    def __init__(self, v2: bool = True) -> None:
        self.v2 = v2

    def wrap(
        self,
        booking_id: int,
        argv: list[str],
        account,
        nodes: list[str],
        limits: JobLimits | None = None,
    ) -> Launch:
        unit = f"gpu-portal-booking-{booking_id}-{secrets.token_hex(3)}.scope"
        allowed = _present(list(SHARED_NODES) + nodes)
        props = limit_properties(limits, self.v2) if limits else []
        note = f"confined by {self.how} {unit} to {_listing(allowed)}"
        wrapped = systemd_run_argv(unit, allowed, account, argv, props)
        # Found on the agent's PATH (as _systemd_missing looked), not the job's.
        wrapped[0] = shutil.which(wrapped[0]) or wrapped[0]
        return Launch(
            wrapped,
            False,
            f"systemd:{unit}",
            f"{note}; limited to {limits.describe()}" if limits else note,
        )


def systemd_run_argv(
    unit: str, nodes: list[str], account, argv: list[str], limits: list[str] | None = None
) -> list[str]:
    """`systemd-run --scope` that runs argv as the account with only `nodes` (and pseudo
    devices) openable, and the scope's `limits` properties. A limited scope is not collected
    at once: its Result (oom-kill) is read when the job ends, then it is stopped and reset."""
    collect = [] if limits else ["--collect"]
    wrapped = ["systemd-run", "--scope", "--quiet", *collect, f"--unit={unit}"]
    wrapped += ["-p", "DevicePolicy=closed", "-p", "DeviceAllow=char-pts rw"]
    for node in nodes:
        wrapped += ["-p", f"DeviceAllow={node} rw"]
    for prop in limits or []:
        wrapped += ["-p", prop]
    if account.pw_uid != os.geteuid():
        wrapped += [f"--uid={account.pw_uid}", f"--gid={account.pw_gid}"]
    return [*wrapped, "--", *argv]


class CgroupV1:
    """A cgroup per job in the v1 devices controller: deny all, allow pseudo + booked nodes.

    Jobs of one agent live under gpu-portal/<agent>/ (the node's name), so an agent cleans up
    after a predecessor that was killed without touching another agent's cgroups.
    """

    how = "cgroup v1 devices"

    def __init__(
        self,
        root: Path = CGROUP_V1_DEVICES,
        agent: str = "agent",
        cgroups: CgroupLimits | None = None,
    ) -> None:
        self.root = Path(root)
        self.home = self.root / _PARENT / safe_name(agent)
        self.cgroups = cgroups

    def sweep(self, keep: set[str]) -> int:
        """Remove this agent's job cgroups that no running job holds (an earlier agent was
        killed, its jobs ended meanwhile); returns how many went."""
        gone = 0
        kept = groups_of(keep)
        for group in sorted(self.home.glob("booking-*")) if self.home.is_dir() else []:
            if str(group) not in kept and not cgroup_pids(group):
                release(f"cgroup:{group}")
                gone += 1
        return gone + (self.cgroups.sweep(kept) if self.cgroups else 0)

    def close(self) -> None:
        """On agent exit: drop this agent's directories if no job cgroup is left in them."""
        try:
            self.home.rmdir()
        except OSError:
            pass  # jobs still run (they outlive the agent) or it was never made
        if self.cgroups is not None:
            self.cgroups.close()

    def wrap(
        self,
        booking_id: int,
        argv: list[str],
        account,
        nodes: list[str],
        limits: JobLimits | None = None,
    ) -> Launch:
        group = self.home / f"booking-{booking_id}-{secrets.token_hex(3)}"
        allowed = _present(list(SHARED_NODES) + nodes)
        try:
            group.mkdir(parents=True)
            _write(group / "devices.deny", "a")
            for rule in PSEUDO_DEVICE_RULES:
                try:
                    _write(group / "devices.allow", rule)
                except OSError:
                    pass  # the agent's own cgroup lacks it: the job goes without, as we do
            for node in allowed:
                _write(group / "devices.allow", device_rule(node))
        except OSError as exc:
            release(f"cgroup:{group}")
            raise ConfinementError(f"cannot set up {group}: {exc}") from exc
        groups, note = [group], f"confined by {self.how} to {_listing(allowed)}"
        if limits is not None:
            try:
                more, held = _limit_groups(self.cgroups, group.name, limits)
            except ConfinementError:
                release(f"cgroup:{group}")
                raise
            groups, note = groups + more, f"{note}; {held}"
        return Launch([*_jail(groups, account), "--", *argv], False, handle_of(groups), note)


def _limit_groups(
    cgroups: CgroupLimits | None, name: str, limits: JobLimits
) -> tuple[list[Path], str]:
    """The job's limit cgroups, made and filled (none where the node has no controller for
    them), and what its `started` event says of them; ConfinementError: they cannot be made."""
    why = cgroups.unavailable() if cgroups else "no cgroup for limits"
    if cgroups is None or why:
        return [], f"not limited ({why})"
    try:
        groups = cgroups.make(name, limits)
    except OSError as exc:
        raise ConfinementError(f"cannot limit the job to {limits.describe()}: {exc}") from exc
    lacking = cgroups.missing()  # some controllers only: those limits go unenforced
    held = f"limited by {cgroups.version} to {limits.describe()}"
    return groups, f"{held} ({lacking})" if lacking else held


def _jail(groups: list[Path], account) -> list[str]:
    """agents/jail.py joining `groups`, then becoming `account` (unless the agent is it)."""
    jail = [sys.executable, "-I", str(JAIL)]
    for group in groups:
        jail += ["--cgroup", str(group)]
    if account.pw_uid != os.geteuid():
        ids = os.getgrouplist(account.pw_name, account.pw_gid)
        jail += [f"--uid={account.pw_uid}", f"--gid={account.pw_gid}"]
        jail += [f"--groups={','.join(map(str, ids))}"]
    return jail


def choose(
    mode: str,
    *,
    agent: str = "agent",
    systemd_dir: Path = SYSTEMD_RUN_DIR,
    cgroup_root: Path = CGROUP_V1_DEVICES,
    limits_root: Path = CGROUP_ROOT,
) -> NoConfinement | SystemdScope | CgroupV1:
    """The confinement for `mode`; a mode that was asked for by name and cannot work raises.
    Its jobs' cores and memory are limited by the same way (`limits_root`: the cgroup mount)."""
    if mode not in MODES:
        raise ConfinementError(f"--confine {mode!r}: choose one of {', '.join(MODES)}")
    cgroups = CgroupLimits(limits_root, agent)
    if mode == "off":
        return NoConfinement("switched off (--confine off)", cgroups)
    no_systemd = _systemd_missing(Path(systemd_dir))
    if mode in ("auto", "systemd") and not no_systemd:
        return SystemdScope(cgroups.v2)
    no_cgroup = _cgroup_v1_missing(Path(cgroup_root))
    if mode in ("auto", "cgroup") and not no_cgroup:
        return CgroupV1(cgroup_root, agent, cgroups)
    if mode == "systemd":
        raise ConfinementError(f"--confine systemd: {no_systemd}")
    if mode == "cgroup":
        raise ConfinementError(f"--confine cgroup: {no_cgroup}")
    return NoConfinement(f"{no_systemd}; {no_cgroup}", cgroups)


def _systemd_missing(systemd_dir: Path) -> str | None:
    if os.geteuid() != 0:
        return "no systemd scope: the agent is not root"
    if not shutil.which("systemd-run"):
        return "no systemd scope: systemd-run is not installed"
    if not systemd_dir.is_dir():
        return f"no systemd scope: systemd is not the init system (no {systemd_dir})"
    return None


def _cgroup_v1_missing(root: Path) -> str | None:
    if os.geteuid() != 0:
        return "no cgroup: the agent is not root"
    if not (root / "devices.allow").exists():
        return (
            f"no cgroup v1 devices controller at {root} (cgroup v2 alone needs systemd, "
            "which installs its eBPF device filter)"
        )
    try:
        (root / _PARENT).mkdir(exist_ok=True)
    except OSError as exc:
        return f"no cgroup: cannot create {root / _PARENT}: {exc}"
    return None


def device_rule(node: str) -> str:
    """The cgroup v1 rule that lets a job read and write one device node, e.g. 'c 195:0 rw'."""
    st = os.stat(node)
    if stat.S_ISCHR(st.st_mode):
        kind = "c"
    elif stat.S_ISBLK(st.st_mode):
        kind = "b"
    else:
        raise ConfinementError(f"{node} is not a device node")
    return f"{kind} {os.major(st.st_rdev)}:{os.minor(st.st_rdev)} rw"


def _present(nodes: list[str]) -> list[str]:
    seen: list[str] = []
    for node in nodes:
        if node not in seen and os.path.exists(node):
            seen.append(node)
    return seen


def _listing(nodes: list[str]) -> str:
    return ", ".join(nodes) if nodes else "no GPU device nodes"


def _write(path: Path, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)
