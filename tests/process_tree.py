"""A process's descendants from /proc (no psutil), for tests that stop a process tree."""

import os
from pathlib import Path


def living(processes: dict[int, str]) -> list[str]:
    """The command lines of those of `processes` ({pid: start time}) still running."""
    return [command(pid) for pid, start in processes.items() if _start_time(pid) == start]


def _children_by_parent() -> dict[int, list[int]]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (stat := _stat(int(entry.name))):
            children.setdefault(int(stat[1]), []).append(int(entry.name))
    return children


def descendants(pid: int) -> dict[int, str]:
    """Every living descendant of `pid`: {pid: start time}."""
    children, found, todo = _children_by_parent(), {}, [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            if (start := _start_time(child)) is not None:
                found[child] = start
                todo.append(child)
    return found


def _stat(pid: int) -> list[str] | None:
    """Fields of /proc/<pid>/stat after the command name: state, ppid, ..."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return None


def _start_time(pid: int) -> str | None:
    """The start time of a living (not zombie) process, None once it is gone."""
    stat = _stat(pid)
    return stat[19] if stat and stat[0] not in ("Z", "X") else None


def command(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def exit_status(pid: int) -> list[int] | None:
    """[exit code] once `pid` (a child of this process) exited, else None."""
    finished, status = os.waitpid(pid, os.WNOHANG)
    return [os.waitstatus_to_exitcode(status)] if finished else None
