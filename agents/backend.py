"""The boundary between the agent and the GPUs.

`agents.nvml.NvmlBackend` reads real GPUs; `agents.simulate.SimulatedBackend` invents
them. The agent (and every test) sees only this interface.
"""

from __future__ import annotations

from typing import Protocol

from agents.host import HostResources
from agents.protocol import DeviceReading, GpuInventory, MigSlot


class MigLayoutError(RuntimeError):
    """A MIG layout change the GPU refused or that failed part-way; the message says why."""


class Backend(Protocol):
    """What the agent needs from a node's GPUs; both backends implement it."""

    def discover(self) -> list[GpuInventory]:
        """The GPUs and MIG instances of this node (static; the agent calls it rarely)."""
        ...

    def sample(self) -> list[DeviceReading]:
        """One reading per whole GPU and per MIG instance, with the processes on each."""
        ...

    def host(self) -> HostResources | None:
        """The node's CPU cores and memory as the backend knows them (a simulated SPEC's);
        None: the machine's own (agents.host.read_machine)."""
        ...

    def device_files(self, uuids: list[str]) -> list[str]:
        """The /dev nodes a job on these GPUs or MIG instances must open (besides nvidiactl and
        nvidia-uvm); agents.confine allows these and no other GPU's."""
        ...

    def apply_mig_layout(self, gpu_uuid: str, instances: list[MigSlot]) -> None:
        """Destroy the MIG instances of GPU ``gpu_uuid`` and create ``instances`` (raise
        MigLayoutError saying why not); ``discover`` reports the new ones from then on."""
        ...

    def close(self) -> None:
        """Release whatever the backend holds open."""
        ...
