"""A job's confinement handle (Job.confinement): "systemd:<unit>" or "cgroup:<dir>;<dir>..."
(its devices cgroup first, then its limit cgroups); how the job ended by it, and its release.
Standard library only, as agents/confine.py."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import time
from pathlib import Path

from agents.limits import cgroup_pids, oom_killed, systemd_oom_killed

log = logging.getLogger(__name__)

# A job's cgroups, one handle: "cgroup:<dir>;<dir>..." (the devices one first).
_SEPARATOR = ";"


def handle_of(groups: list[Path]) -> str:
    return "cgroup:" + _SEPARATOR.join(map(str, groups))


def groups_of(handles: set[str]) -> set[str]:
    """Every cgroup directory the handles name."""
    dirs: set[str] = set()
    for handle in handles:
        scheme, _, names = handle.partition(":")
        if scheme == "cgroup":
            dirs.update(names.split(_SEPARATOR))
    return dirs


def job_oom_killed(handle: str | None, exit_code: int | None) -> bool:
    """Whether the job's own memory limit killed it; ask before `release` removes its cgroup."""
    if not handle:
        return False
    scheme, _, name = handle.partition(":")
    if scheme == "systemd":
        return systemd_oom_killed(name)
    return oom_killed([Path(g) for g in name.split(_SEPARATOR)], exit_code)


def release(handle: str | None, wait_s: float = 2.0) -> None:
    """After a job: kill what it left behind in its cgroup or scope, then remove that."""
    if not handle:
        return
    scheme, _, name = handle.partition(":")
    if scheme == "systemd":
        # A limited scope was not collected at once (its Result is read first): reset it too.
        for verb in ("stop", "reset-failed"):
            try:
                subprocess.run(["systemctl", verb, "--quiet", name], timeout=30, check=False)
            except (OSError, subprocess.TimeoutExpired) as exc:
                log.warning("could not %s %s: %s", verb, name, exc)
        return
    for group in name.split(_SEPARATOR):
        _release_group(Path(group), wait_s)


def _release_group(group: Path, wait_s: float) -> None:
    deadline = time.monotonic() + wait_s
    while group.exists():
        for pid in cgroup_pids(group):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            group.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError as exc:
            if time.monotonic() >= deadline:
                log.warning("could not remove %s: %s", group, exc)
                return
            time.sleep(0.05)
