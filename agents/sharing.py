"""Jobs that share a GPU: each one's share in its environment, and MPS where the site wants it.

A booking of a fraction of a shared GPU (DesiredBooking.gpu_fraction) gets the GPU in
CUDA_VISIBLE_DEVICES like any other, and its share in GPU_PORTAL_GPU_FRACTION (0-1) and
GPU_PORTAL_GPU_MEMORY_MIB. What holds it to its memory share is agents.memshare.

With --mps the agent also runs one MPS control daemon per shared GPU (NVIDIA's Multi-Process
Service: the tenants' kernels run side by side, each held to its share of the SMs and of the
memory). The daemon is started when the GPU's first tenant is launched and told `quit` when its
last one ends, or when the agent stops (`quit` lets running clients finish). Its pipe and log
directories are under the agent's state directory, one pair per GPU, and it sees that GPU alone
(CUDA_VISIBLE_DEVICES=the UUID, which clients name too: MPS remaps indexes, never UUIDs). Each
tenant gets the daemon's CUDA_MPS_PIPE_DIRECTORY, CUDA_MPS_ACTIVE_THREAD_PERCENTAGE (its share of
the SMs) and CUDA_MPS_PINNED_DEVICE_MEM_LIMIT ("0=<MiB>M": device 0 is the one GPU it sees).
"""

from __future__ import annotations

import logging
import math
import os
import shutil
import subprocess
from pathlib import Path

from agents.protocol import DesiredBooking

log = logging.getLogger(__name__)

MPS_CONTROL = "nvidia-cuda-mps-control"
_MPS_TIMEOUT_S = 10.0


def is_shared(booking: DesiredBooking) -> bool:
    """Whether `booking` holds a share of a GPU rather than whole devices."""
    return booking.gpu_fraction is not None


def share_variables(booking: DesiredBooking) -> dict[str, str]:
    """GPU_PORTAL_GPU_FRACTION and GPU_PORTAL_GPU_MEMORY_MIB of a shared booking (else none)."""
    if not is_shared(booking):
        return {}
    found = {"GPU_PORTAL_GPU_FRACTION": f"{booking.gpu_fraction:g}"}
    if booking.gpu_memory_mib is not None:
        found["GPU_PORTAL_GPU_MEMORY_MIB"] = str(booking.gpu_memory_mib)
    return found


def thread_percentage(fraction: float) -> int:
    """A share as MPS's active thread percentage: whole percent, at least 1, at most 100."""
    return min(100, max(1, math.ceil(fraction * 100 - 1e-9)))


def mps_available() -> str | None:
    """The path of nvidia-cuda-mps-control on PATH, or None."""
    return shutil.which(MPS_CONTROL)


class MpsDaemons:
    """One MPS control daemon per shared GPU with tenants, run through the
    nvidia-cuda-mps-control found on PATH."""

    def __init__(self, state_dir: str | Path):
        self._root = Path(state_dir) / "mps"
        self.tenants: dict[str, set[int]] = {}  # GPU uuid -> booking ids on its daemon

    def pipe_directory(self, uuid: str) -> Path:
        return self._root / uuid / "pipe"

    def log_directory(self, uuid: str) -> Path:
        return self._root / uuid / "log"

    def _env(self, uuid: str) -> dict[str, str]:
        return {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "CUDA_VISIBLE_DEVICES": uuid,
            "CUDA_MPS_PIPE_DIRECTORY": str(self.pipe_directory(uuid)),
            "CUDA_MPS_LOG_DIRECTORY": str(self.log_directory(uuid)),
        }

    def join(self, booking: DesiredBooking) -> dict[str, str]:
        """Make `booking` a tenant of its GPU's daemon (starting it for the first one); the
        variables its job needs. Raises OSError when the daemon cannot be started."""
        if not booking.device_uuids:
            return {}
        uuid = booking.device_uuids[0]  # a share is of one GPU
        if not self.tenants.get(uuid):
            self._start(uuid)
        self.tenants.setdefault(uuid, set()).add(booking.booking_id)
        found = {"CUDA_MPS_PIPE_DIRECTORY": str(self.pipe_directory(uuid))}
        found["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(
            thread_percentage(booking.gpu_fraction or 1.0)
        )
        if booking.gpu_memory_mib is not None:
            found["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = f"0={booking.gpu_memory_mib}M"
        return found

    def leave(self, booking_id: int) -> None:
        """`booking_id` ended: a GPU it was the last tenant of has its daemon stopped."""
        for uuid, tenants in list(self.tenants.items()):
            if booking_id in tenants:
                tenants.discard(booking_id)
                if not tenants:
                    del self.tenants[uuid]
                    self._quit(uuid)

    def stop_all(self) -> None:
        """The agent stops: every daemon is told to quit (running clients finish first)."""
        for uuid in list(self.tenants):
            del self.tenants[uuid]
            self._quit(uuid)

    def _start(self, uuid: str) -> None:
        for directory in (self.pipe_directory(uuid), self.log_directory(uuid)):
            directory.mkdir(parents=True, exist_ok=True)
            # The tenants (any user) reach the daemon's pipes; the logs are the agent's.
            os.chmod(directory, 0o755 if directory.name == "pipe" else 0o700)
        os.chmod(self._root, 0o711)
        os.chmod(self._root / uuid, 0o711)
        result = self._call(uuid, ["-d"], None)
        if result is None or result.returncode != 0:
            raise OSError(f"{MPS_CONTROL} -d did not start for {uuid}")
        log.info("MPS control daemon started for %s", uuid)

    def _quit(self, uuid: str) -> None:
        result = self._call(uuid, [], b"quit\n")
        if result is None or result.returncode != 0:
            log.warning("MPS control daemon of %s did not take quit", uuid)
        else:
            log.info("MPS control daemon of %s told to quit", uuid)

    def _call(
        self, uuid: str, args: list[str], stdin: bytes | None
    ) -> subprocess.CompletedProcess | None:
        binary = mps_available()
        if binary is None:
            log.warning("%s is not on PATH", MPS_CONTROL)
            return None
        try:
            return subprocess.run(
                [binary, *args],
                input=stdin,
                env=self._env(uuid),
                capture_output=True,
                timeout=_MPS_TIMEOUT_S,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            log.warning("%s %s for %s: %s", MPS_CONTROL, " ".join(args), uuid, exc)
            return None
