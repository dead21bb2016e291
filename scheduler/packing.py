"""Packing replay: place a trace's pods as they arrive and leave, and measure the GPUs they need.

A pod asks for ``gpus`` GPUs of ``fraction`` each: a fraction below 1 (one GPU only) is a share
of a GPU, as Alibaba's GPU-sharing pods ask (openb_gpushare.csv). The loop has no queueing
model of its own: at each instant it ends the pods whose time is up, then asks a *placer* where
the pods waiting (the ones just arrived and any that did not fit before) go, in arrival order.
After each instant it records the GPUs with at least one tenant, the nodes with at least one,
the capacity asked for and the stranded capacity (``scheduler.fragmentation``); figures are
time-weighted over the trace's span, from its first arrival to its last departure
(``scheduler.packing_replay``).

Placers: ``AllocatorPlacer`` calls ``plan()`` on a ``State`` snapshot of the pods alive (the
portal's placement); ``FirstFit`` is the simple baseline: each pod in arrival order on the
first GPU (in device order) with room for its fraction, a whole-GPU pod on the first node with
enough idle GPUs. As in the allocator, a shared GPU (``Device.shared``) takes fractions only and
a fraction only goes to a shared GPU; on a cluster with no shared GPU a fraction pod holds a
whole GPU (the exclusive baseline).
"""

from __future__ import annotations

import csv
import math
from collections.abc import Sequence
from dataclasses import dataclass

from scheduler.allocator import plan
from scheduler.fragmentation import EPSILON, Shape
from scheduler.replay import POLICIES
from scheduler.types import Allocation, Device, Policy, Request, State

MAX_PODS = 200_000  # rows a trace may hold: refused past this, before anything is built
MAX_POD_GPUS = 64
# Memory of a shared GPU: traces carry no memory figure, so a fraction f holds f of it (the
# allocator's rule for a compute share); compute is what binds.
SHARED_MEMORY_MIB = 81920
COLUMNS = ("job_id", "submit_time_s", "duration_s", "num_gpus")
# Arrival order, no priority factors and no estimates past the head (the replay's "easy"):
# only placement differs between runs.
PACKING_POLICY = POLICIES["easy"]


@dataclass(frozen=True)
class Pod:
    """One trace row: ``fraction`` of each of ``gpus`` GPUs (below 1 only with one GPU)."""

    pod_id: str
    submit: float
    duration: float
    gpus: int
    fraction: float = 1.0

    @property
    def shape(self) -> Shape:
        return (self.gpus, self.fraction)

    @property
    def demand(self) -> float:
        """GPU-equivalents asked for."""
        return self.gpus * self.fraction


class TraceError(ValueError):
    """A trace row out of bounds: the message names the line and the column."""


def load_pods(path: str, *, max_pods: int = MAX_PODS, half: str | None = None) -> list[Pod]:
    """Read a pod trace (job_id,submit_time_s,duration_s,num_gpus[,gpu_fraction]; other columns
    ignored), sorted by arrival. Every row is checked before the list is built: at most
    ``max_pods`` rows, times whole non-negative seconds, 1 to 64 GPUs, a fraction in (0, 1] and
    below 1 only for one GPU. ``half``: "first" or "second" keeps that half of the pods in
    arrival order. By count, not by the submit span as ``scheduler.replay.load_jobs``: the openb
    snapshot's arrivals are skewed (1 % of its pods arrive in the first 78 % of its span), so a
    span's first half would hold 11 pods."""
    if half not in (None, "first", "second"):
        raise TraceError(f"half must be 'first' or 'second', not {half!r}")
    pods = []
    with open(path, newline="") as handle:
        reader = csv.DictReader(handle)
        missing = [name for name in COLUMNS if name not in (reader.fieldnames or ())]
        if missing:
            raise TraceError(f"{path}: missing column(s) {', '.join(missing)}")
        for row in reader:
            if len(pods) >= max_pods:
                raise TraceError(f"{path}: more than {max_pods} rows")
            pods.append(_pod(row, reader.line_num))
    pods.sort(key=lambda pod: (pod.submit, pod.pod_id))
    if half is not None:
        middle = len(pods) // 2
        pods = pods[:middle] if half == "first" else pods[middle:]
    return pods


def _pod(row: dict, line: int) -> Pod:
    def whole(name: str, low: int, high: int | None = None) -> int:
        text = (row.get(name) or "").strip()
        if not (text.isascii() and text.isdigit()) or len(text) > 12:
            raise TraceError(f"line {line}: {name} must be a whole number, not {text!r}")
        value = int(text)
        if value < low or (high is not None and value > high):
            raise TraceError(f"line {line}: {name} must be in [{low}, {high}], not {value}")
        return value

    gpus = whole("num_gpus", 1, MAX_POD_GPUS)
    text = (row.get("gpu_fraction") or "1").strip()
    try:
        fraction = float(text) if len(text) <= 12 else math.nan
    except ValueError:
        fraction = math.nan
    if not 0 < fraction <= 1:  # also refuses nan
        raise TraceError(f"line {line}: gpu_fraction must be in (0, 1], not {text!r}")
    if fraction < 1 and gpus != 1:
        raise TraceError(f"line {line}: a gpu_fraction below 1 needs num_gpus 1, not {gpus}")
    return Pod(
        pod_id=row["job_id"],
        submit=float(whole("submit_time_s", 0)),
        duration=float(whole("duration_s", 0)),
        gpus=gpus,
        fraction=fraction,
    )


def cluster(nodes: int, gpus_per_node: int = 8, *, shared_nodes: int = 0) -> tuple[Device, ...]:
    """``nodes`` nodes of whole GPUs, the first ``shared_nodes`` of them in sharing mode (every
    GPU ``Device.shared``, of ``SHARED_MEMORY_MIB``: fractions only, as the allocator offers
    shared GPUs)."""
    return tuple(
        Device(
            id=f"n{n:03d}-g{g}",
            node=f"n{n:03d}",
            model="gpu",
            shared=n < shared_nodes,
            memory_mib=SHARED_MEMORY_MIB if n < shared_nodes else 0,
        )
        for n in range(nodes)
        for g in range(gpus_per_node)
    )


def sharing(devices: Sequence[Device]) -> bool:
    """Whether fractions are shared here: with no shared GPU, a fraction pod takes a whole one."""
    return any(device.shared for device in devices)


def fractional(pod: Pod, shared: bool) -> bool:
    """The pod holds a fraction of a shared GPU (not a whole GPU)."""
    return shared and pod.fraction < 1


@dataclass(frozen=True)
class Placed:
    """A pod alive on ``device_ids``, holding ``share`` of each (1.0: the whole GPU)."""

    pod: Pod
    device_ids: tuple[str, ...]
    start: float
    share: float


class FirstFit:
    """The baseline: a fraction on the first shared GPU with room, whole GPUs on the first
    exclusive node with enough idle ones (devices in listing order, one pod at a time)."""

    def __init__(self, devices: Sequence[Device]) -> None:
        self.devices, self.shared = tuple(devices), sharing(devices)
        self.nodes: dict[str, list[str]] = {}
        for device in self.devices:
            if not device.shared:
                self.nodes.setdefault(device.node, []).append(device.id)

    def place(self, now: float, alive: dict[str, Placed], pending: list[Pod]) -> dict:
        """Device ids for each pending pod that fits now (pod id -> ids)."""
        free = free_capacity(self.devices, alive)
        out = {}
        for pod in pending:
            chosen = self._choose(pod, free)
            if chosen:
                share = pod.fraction if fractional(pod, self.shared) else 1.0
                for device_id in chosen:
                    free[device_id] -= share
                out[pod.pod_id] = chosen
        return out

    def _choose(self, pod: Pod, free: dict[str, float]) -> tuple[str, ...]:
        if fractional(pod, self.shared):
            for device in self.devices:
                if device.shared and free[device.id] >= pod.fraction - EPSILON:
                    return (device.id,)
            return ()
        for ids in self.nodes.values():
            idle = [device_id for device_id in ids if free[device_id] >= 1 - EPSILON]
            if len(idle) >= pod.gpus:
                return tuple(idle[: pod.gpus])
        return ()


class AllocatorPlacer:
    """The portal's placement: one ``plan()`` pass over the pods alive and the pods waiting."""

    def __init__(self, devices: Sequence[Device], policy: Policy = PACKING_POLICY) -> None:
        self.devices, self.policy = tuple(devices), policy
        self.shared = sharing(devices)

    def place(self, now: float, alive: dict[str, Placed], pending: list[Pod]) -> dict:
        """Device ids of the starts of one pass (pod id -> ids)."""
        result = plan(self.state(now, alive, pending), self.policy, starts_only=True)
        return {start.booking_id: start.device_ids for start in result.starts}

    def state(self, now: float, alive: dict[str, Placed], pending: list[Pod]) -> State:
        """The snapshot ``plan()`` sees: every pod as a booking of the one synthetic user."""
        return State(
            now=now,
            devices=self.devices,
            allocations=tuple(self._allocation(placed) for placed in alive.values()),
            pending=tuple(self._request(pod) for pod in pending),
        )

    @staticmethod
    def _allocation(placed: Placed) -> Allocation:
        pod = placed.pod
        end = placed.start + max(pod.duration, 1.0)
        return Allocation(
            pod.pod_id, placed.device_ids, placed.start, end, "trace", "trace", share=placed.share
        )

    def _request(self, pod: Pod) -> Request:
        return Request(
            booking_id=pod.pod_id,
            user="trace",
            project="trace",
            submit_time=pod.submit,
            duration_s=max(pod.duration, 1.0),
            gpus=pod.gpus,
            gpu_fraction=pod.fraction if fractional(pod, self.shared) else None,
        )


def free_capacity(devices: Sequence[Device], alive: dict[str, Placed]) -> dict[str, float]:
    """Each device's free fraction (1.0: idle) with the pods alive on it."""
    free = {device.id: 1.0 for device in devices}
    for placed in alive.values():
        for device_id in placed.device_ids:
            free[device_id] -= placed.share
    return free
