"""Running a booking's command in a container image: the node's runtimes and their launch lines.

A booking that names an image runs ``/bin/sh -c COMMAND`` inside it through one of the node's
runtimes, with only the booked devices visible and the same user, working directory,
environment and signals as a plain job:

- Podman and Docker get the devices through CDI (``--device nvidia.com/gpu=<UUID>``; the node
  generates its CDI spec with ``nvidia-ctk cdi generate --device-name-strategy=uuid``), run the
  command as the job's uid:gid (Podman rootless keeps it with ``--userns=keep-id``), bind the
  working directory, forward the environment by name (values never on the command line), and
  put an init in the container (``--init``) so the SIGTERM the agent sends the runtime's
  client reaches the command, not a PID 1 that ignores it.
- Apptainer and Singularity run as the job's user already; ``--nv --nvccli`` with
  ``NVIDIA_VISIBLE_DEVICES`` mounts the booked GPUs only, ``--cleanenv`` keeps the host's
  environment out and ``APPTAINERENV_``/``SINGULARITYENV_`` variables carry the job's in.

Which runtimes may run which image is ``protocol.image_runtimes`` (shared with the portal, which
refuses at submit an image no node can run). The runtime is given the image as ``agents.images``
parses it (the full reference, the normalised path), never the text as it came; text that is no
reference a runtime would run is not launched (``BadImage``).
"""

from __future__ import annotations

import logging
import os
import pwd
import shutil
import subprocess
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from agents.images import Image, ImageError, image_parse
from agents.protocol import CONTAINER_RUNTIMES, image_runtimes

SHELL = "/bin/sh"
log = logging.getLogger(__name__)


def detect_runtimes(which=shutil.which) -> list[str]:
    """The container runtimes installed on this node, in the portal's order."""
    return [name for name in CONTAINER_RUNTIMES if which(name)]


@dataclass(frozen=True)
class ContainerLaunch:
    """The runtime's command line and the variables it needs in its own environment."""

    runtime: str
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    # [runtime, container name] for a runtime whose container outlives a killed client.
    handle: list[str] | None = None


class NoRuntime(OSError):
    """No runtime of this node can run the image; the message says which would."""


class BadImage(OSError):
    """The image is no reference a runtime would run (the portal refuses it at submit)."""


def container_launch(
    *,
    runtimes: Iterable[str],
    booking_id: int,
    image: str,
    command: str,
    device_uuids: list[str],
    uid: int,
    gid: int,
    env: Mapping[str, str],
    workdir: str,
    extra_args: Mapping[str, list[str]] | None = None,
    inject_devices: bool = True,
    resources: list[str] | None = None,
) -> ContainerLaunch:
    """The launch of ``command`` in ``image`` on the first runtime of ``runtimes`` that can run
    it. ``env`` is the job's environment (it goes into the container); ``extra_args`` are the
    site's own options per runtime (e.g. podman's ``--runtime``), placed before the image.
    ``inject_devices=False`` (simulated GPUs, which no CDI spec or driver knows) gives the
    container no devices: no ``--device``, no ``--nv``; CUDA_VISIBLE_DEVICES still names them.
    ``resources`` are Podman's and Docker's options for the job's cores and memory
    (agents.limits.oci_options): their containers live in the runtime's cgroups, not the job's
    (Apptainer's run in the job's own, which hold them)."""
    try:
        parsed = image_parse(image)
    except ImageError as exc:
        raise BadImage(f"image {image!r} is not an image reference: {exc}") from None
    device_uuids = device_uuids if inject_devices else []
    have = list(runtimes)
    usable = [name for name in image_runtimes(image) if name in have]
    if not usable:
        wanted = " or ".join(image_runtimes(image))
        raise NoRuntime(
            f"image {image!r} needs {wanted}; this node has {', '.join(have) or 'none'}"
        )
    runtime = usable[0]
    extra = list((extra_args or {}).get(runtime, ()))
    if runtime in ("podman", "docker"):
        extra = list(resources or []) + extra
        argv = _oci_argv(runtime, booking_id, parsed, device_uuids, uid, gid, env, workdir, extra)
        handle = [runtime, f"gpu-portal-{booking_id}"]
        return ContainerLaunch(runtime, argv + [SHELL, "-c", command], handle=handle)
    argv, runtime_env = _apptainer(
        runtime, parsed, device_uuids, env, workdir, extra, inject_devices
    )
    return ContainerLaunch(runtime, argv + [SHELL, "-c", command], runtime_env)


def container_remove(handle: list[str] | None, unix_user: str) -> None:
    """Remove a stopped job's container: Podman's and Docker's keep running under their
    monitor when the client is killed (SIGKILL after the grace), holding the GPUs."""
    if not handle:
        return
    runtime, name = handle
    as_user = {}
    if os.geteuid() == 0 and unix_user != "root" and runtime == "podman":
        account = pwd.getpwnam(unix_user)  # rootless Podman: the user's own containers
        as_user = {"user": account.pw_uid, "group": account.pw_gid}
    try:
        subprocess.run(
            [runtime, "rm", "--force", name],
            capture_output=True,
            timeout=30,
            check=False,
            **as_user,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        log.warning("could not remove container %s: %s", name, exc)


def _oci_argv(runtime, booking_id, image: Image, device_uuids, uid, gid, env, workdir, extra):
    argv = [runtime, "run", "--rm", "--init", "--name", f"gpu-portal-{booking_id}"]
    argv += ["--user", f"{uid}:{gid}"]
    if runtime == "podman" and os.geteuid() != 0:
        argv.append("--userns=keep-id")  # rootless: the job's uid inside is the user's own
    argv += ["--workdir", workdir, "--volume", f"{workdir}:{workdir}"]
    for name in sorted(env):
        if name not in (
            "PATH",
            "NVIDIA_VISIBLE_DEVICES",
        ):  # the image's own PATH finds its programs
            argv += ["--env", name]
    # Named outright, over the image's own (CUDA images say "all"), for an NVIDIA hook that reads it.
    argv += ["--env", f"NVIDIA_VISIBLE_DEVICES={','.join(device_uuids) or 'void'}"]
    for uuid in device_uuids:
        argv += ["--device", f"nvidia.com/gpu={uuid}"]
    # The full name: a short one would be looked up in the node's search registries.
    return argv + extra + [image.name]


def _apptainer(runtime, image: Image, device_uuids, env, workdir, extra, inject_devices=True):
    prefix = "APPTAINERENV_" if runtime == "apptainer" else "SINGULARITYENV_"
    runtime_env = {f"{prefix}{name}": value for name, value in env.items()}
    argv = [runtime, "exec"]
    if inject_devices:
        runtime_env["NVIDIA_VISIBLE_DEVICES"] = ",".join(device_uuids) or "void"
        argv += ["--nv", "--nvccli"]
    argv += ["--cleanenv", "--pwd", workdir]
    return argv + extra + [image.uri], runtime_env
