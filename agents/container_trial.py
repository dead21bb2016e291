"""A trivial container through each runtime, as `python -m agents check` runs it.

A runtime on PATH is not one that works: a Docker client without its daemon, or Podman whose
OCI runtime fails (a missing runc, rlimits the host refuses), fails every job the agent would
send it. The trial runs ``/bin/sh -c true`` in a tiny image made from this host's own shell
(no registry needed) with the launch line a job gets (agents.containers.container_launch, the
site's ``--container-arg`` options included, no devices), then removes the image.
"""

from __future__ import annotations

import os
import subprocess
import tarfile
import tempfile
from collections.abc import Iterable
from pathlib import Path

from agents.containers import container_launch

SHELL = "/bin/sh"
TRIAL_TIMEOUT_S = 120
_OCI = ("podman", "docker")


def rootfs_tar(programs: Iterable[str], tarball: Path) -> None:
    """A root filesystem holding `programs` and the shared libraries they load (ldd), at their
    host paths: enough for a container to run them with no image registry."""
    files = {}
    for program in programs:
        real = os.path.realpath(program)
        files[program] = real
        files.update({library: os.path.realpath(library) for library in _libraries(real)})
    with tarfile.open(tarball, "w") as tar:
        for path, real in sorted(files.items()):
            tar.add(real, arcname=path.lstrip("/"))


def _libraries(program: str) -> list[str]:
    out = subprocess.run(["ldd", program], capture_output=True, text=True).stdout
    return [word for line in out.splitlines() for word in line.split() if word.startswith("/")]


def container_trial(runtime: str, extra_args: list[str]) -> str | None:
    """Run the trivial container through `runtime`: None when it ran and exited 0, else the
    reason (the runtime's own last words)."""
    with tempfile.TemporaryDirectory(prefix="gpu-portal-check-") as scratch:
        root = Path(scratch)
        rootfs_tar([SHELL], root / "rootfs.tar")
        if runtime in _OCI:
            image = f"localhost/gpu-portal-check:{os.getpid()}"
            failed = _run([runtime, "import", str(root / "rootfs.tar"), image])
            if failed:
                return failed
            try:
                return _run(_launch(runtime, image, root, extra_args))
            finally:
                _run([runtime, "rmi", "--force", image])
        sandbox = root / "rootfs"  # Apptainer and Singularity run a directory as an image
        with tarfile.open(root / "rootfs.tar") as tar:
            tar.extractall(sandbox)
        return _run(_launch(runtime, str(sandbox), root, extra_args))


def _launch(runtime: str, image: str, workdir: Path, extra_args: list[str]) -> list[str]:
    launch = container_launch(
        runtimes=[runtime],
        booking_id=0,
        image=image,
        command="true",
        device_uuids=[],
        uid=os.geteuid(),
        gid=os.getegid(),
        env={},
        workdir=str(workdir),
        extra_args={runtime: extra_args},
        inject_devices=False,
    )
    argv = list(launch.argv)
    if "--name" in argv:  # never a job's name (gpu-portal-<booking id>)
        argv[argv.index("--name") + 1] = f"gpu-portal-check-{os.getpid()}"
    return argv


def _run(argv: list[str]) -> str | None:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=TRIAL_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return f"`{' '.join(argv[:2])}` did not finish in {TRIAL_TIMEOUT_S} s"
    except OSError as exc:
        return str(exc)
    if done.returncode == 0:
        return None
    words = [line.strip() for line in (done.stderr + done.stdout).splitlines() if line.strip()]
    last = words[-1] if words else "no message"
    return f"`{' '.join(argv[:2])}` exited {done.returncode}: {last}"
