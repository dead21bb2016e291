"""A batch job's environment and files, on one node or many (docs/distributed.md).

Every job gets a directory of its own under the agent's state directory: its launch script (the
agent's alone: it holds the booking's variables), its hostfile (`host slots=N` lines, as DeepSpeed
and Open MPI read them) and its end file (the booking's end, ISO-8601, rewritten when the booking
is extended), both readable by the job. The launch script reaches the shell on its standard input,
so it never shows in `ps` and needs no path the job's user can open. It runs as the job's user:
it changes to the working directory, sends stdout and stderr to `gpu-portal-<id>.out` there (`gpu-portal-<id>.<rank>.out` on the other ranks), sets
the booking's own variables and runs the command. The agent never opens the working directory's
files as root for writing; it reads the output file only when it is a regular file (no symlink)
owned by the job's user.

The script stays the command's parent: when the command ends it writes its exit status to the
job's exit file (which the agent made, the job's user's), then leaves as the command did (the
same exit code, or killed by the same signal). So an agent that was not running when the job
ended still learns how it ended; a job that left no status (its script killed too, the node
restarted) ended unwatched, which no one may take for a success (docs/agent-portal.md). Signals
to the job's group (the booking's warning, SIGTERM) reach the command as before: the script only
defers them until the command has ended.
"""

from __future__ import annotations

import os
import pwd
import shlex
import signal
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from agents.protocol import DesiredBooking, NodePlace, job_env_reserved, output_file_name

LAUNCH_SCRIPT = "launch.sh"
HOSTFILE = "hostfile"
END_FILE = "end"
EXIT_FILE = "exit"
# The exit code of a job whose working directory cannot be entered (as a shell says 126:
# found but cannot be run).
EXIT_NO_WORKDIR = 126
SHELL = "/bin/sh"


@dataclass(frozen=True)
class JobFiles:
    """Where one job's files are: its own directory, working directory and output file."""

    directory: Path
    workdir: str
    output: str

    @property
    def script(self) -> Path:
        return self.directory / LAUNCH_SCRIPT

    @property
    def hostfile(self) -> Path:
        return self.directory / HOSTFILE

    @property
    def end_file(self) -> Path:
        return self.directory / END_FILE

    @property
    def exit_file(self) -> Path:
        return self.directory / EXIT_FILE


def job_files(
    state_dir: Path,
    booking: DesiredBooking,
    account: pwd.struct_passwd,
    default_workdir: str | None = None,
) -> JobFiles:
    """The paths of `booking`'s files (nothing is written)."""
    # No working directory asked for: the site's default (--default-workdir), else the home,
    # else / for an account without one.
    home = account.pw_dir if os.path.isdir(account.pw_dir) else "/"
    workdir = booking.workdir or default_workdir or home
    return JobFiles(
        directory=state_dir / "jobs" / f"booking-{booking.booking_id}",
        workdir=workdir,
        output=os.path.join(workdir, output_file_name(booking.booking_id, booking.node_rank)),
    )


def placement(booking: DesiredBooking, hostname: str, address: str) -> list[NodePlace]:
    """The booking's nodes in rank order; a booking the portal sent no node list is this node."""
    return booking.nodes or [NodePlace(hostname, address, len(booking.device_uuids))]


def launch_variables(
    booking: DesiredBooking, files: JobFiles, nodes: list[NodePlace], master_port: int
) -> dict[str, str]:
    """What torchrun, DeepSpeed and mpirun read to form one job out of every node's process."""
    return {
        "MASTER_ADDR": nodes[0].address,
        "MASTER_PORT": str(master_port),
        "WORLD_SIZE": str(sum(node.slots for node in nodes)),
        "NODE_RANK": str(booking.node_rank),
        "LOCAL_WORLD_SIZE": str(len(booking.device_uuids)),
        "GPU_PORTAL_NNODES": str(len(nodes)),
        "GPU_PORTAL_NODELIST": ",".join(node.hostname for node in nodes),
        "GPU_PORTAL_HOSTFILE": str(files.hostfile),
        "GPU_PORTAL_END": booking.end.isoformat(),
        "GPU_PORTAL_END_FILE": str(files.end_file),
        "GPU_PORTAL_RESTART_COUNT": str(booking.restart_count),
        "GPU_PORTAL_WORKDIR": files.workdir,
        "GPU_PORTAL_OUTPUT": files.output,
    }


def write_job_files(
    booking: DesiredBooking,
    files: JobFiles,
    nodes: list[NodePlace],
    *,
    run: list[str] | None = None,
    owner: tuple[int, int] | None = None,
    agent_env: Mapping[str, str] | None = None,
) -> list[str]:
    """Write the job's directory (launch script, hostfile, end file, an empty exit file that
    `owner` (uid, gid) may write); the argv that runs the script, which goes on the shell's
    standard input (`files.script`). `run` is what the script runs in the end (a container
    runtime's launch line); None: the booking's command. `agent_env` is the environment the
    agent starts the script with: its reserved variables (the devices, the launch) are set
    again after the booking's own."""
    files.directory.mkdir(parents=True, exist_ok=True)
    os.chmod(files.directory.parent, 0o711)  # the job opens its files by name, lists nothing
    os.chmod(files.directory, 0o711)
    files.hostfile.write_text("".join(f"{node.hostname} slots={node.slots}\n" for node in nodes))
    os.chmod(files.hostfile, 0o644)
    write_end(files, booking.end.isoformat())
    files.exit_file.unlink(missing_ok=True)  # a relaunch must not read the last run's status
    files.exit_file.touch(0o644)
    if owner is not None and os.geteuid() == 0:
        os.chown(files.exit_file, *owner)
    fd = os.open(files.script, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as script:
        script.write(_script(booking, files, run, agent_env or {}))
    return [SHELL, "-s"]


def write_end(files: JobFiles, end: str) -> None:
    """(Re)write the end file; replaced whole, so a job never reads half of it."""
    tmp = files.end_file.with_suffix(".tmp")
    tmp.write_text(end + "\n")
    os.chmod(tmp, 0o644)
    os.replace(tmp, files.end_file)


# Signals the script defers while its command runs (those a booking may warn with, and TERM):
# they reach the command through its process group; the script must outlive it to say how it ended.
_DEFERRED = "HUP INT QUIT USR1 USR2 TERM ALRM URG WINCH"
# Exit codes 129-159 are a shell's "killed by signal N" (128 + N).
_SIGNALLED = (128, 160)


def _script(
    booking: DesiredBooking, files: JobFiles, run: list[str] | None, agent_env: Mapping[str, str]
) -> str:
    q = shlex.quote
    out = output_file_name(booking.booking_id, booking.node_rank)
    status = q(str(files.exit_file))
    # Runs as the command itself (exec): fd 2 from fd 3, so that what the script's shell says
    # about a command killed by a signal ("Terminated") goes nowhere, not into the job's output.
    inner = f"exec {shlex.join(run)}" if run else f"exec {SHELL} -c {q(booking.command or '')}"
    lines = [
        f"trap : {_DEFERRED}",
        f"cd -- {q(files.workdir)} || {{ echo {EXIT_NO_WORKDIR} >{status}; exit {EXIT_NO_WORKDIR}; }}",
        # A directory the job may not write keeps the output in the agent's log (`command`: a
        # failed redirection must not end the shell).
        f"command exec >>{q(out)} 2>&1 || echo {q(f'gpu-portal: cannot write {out}; output is in the node log')} >&2",
        # The booking's variables are set here, as its user, never in the environment of a
        # wrapper that still runs as root (systemd-run, the cgroup jail).
        # A name only the agent sets (the portal refuses it at submit) is never exported.
        *(f"export {v.name}={q(v.value)}" for v in booking.env if not job_env_reserved(v.name)),
        # Then the agent's own device and launch variables again, whatever came before: a
        # booking's variables never choose its devices (CUDA_ and NVIDIA_VISIBLE_DEVICES, the
        # runtime's APPTAINERENV_*).
        *(
            f"export {name}={q(agent_env[name])}"
            for name in sorted(agent_env)
            if job_env_reserved(name)
        ),
        "exec 3>&2 2>/dev/null",
        f"{SHELL} -c {q('exec 2>&3 3>&-; ' + inner)} </dev/null",
        "gpu_portal_status=$?",
        f"echo $gpu_portal_status >{status}",
        # Leave as the command did: killed by its signal (the trap undone first), else its code.
        f"trap - {_DEFERRED}",
        f"[ $gpu_portal_status -gt {_SIGNALLED[0]} ] && [ $gpu_portal_status -lt {_SIGNALLED[1]} ]"
        f" && kill -$((gpu_portal_status - {_SIGNALLED[0]})) $$",
        "exit $gpu_portal_status",
    ]
    return "\n".join(lines) + "\n"


def read_exit_status(files: JobFiles) -> int | None:
    """The exit status the launch script wrote when its command ended; None: none was written
    (the script itself was killed, or the job still runs). Reads a few bytes, never follows a
    link, and takes only a shell's status (0-255)."""
    try:
        fd = os.open(files.exit_file, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        text = os.read(fd, 8).decode("ascii", "replace").strip()
    finally:
        os.close(fd)
    return int(text) if text.isdigit() and int(text) <= 255 else None


def owned_output(path: str, uid: int) -> str | None:
    """`path` if it is a regular file owned by `uid` (never through a symlink), else None."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
    finally:
        os.close(fd)
    return path if st.st_uid == uid and stat.S_ISREG(st.st_mode) else None


def signal_number(name: str) -> int:
    """The number of a signal named without its SIG prefix ("USR1")."""
    return int(getattr(signal, f"SIG{name}"))
