"""The agent <-> portal wire protocol, shared by both sides.

The portal imports this module too, so it must stay free of Django and of anything
the node agent alone needs. Messages are frozen dataclasses; `to_json` turns one
into a JSON-ready dict and `from_json` validates a dict (or JSON text) back into
one, raising `ProtocolError` that names the offending field.
"""

from __future__ import annotations

import dataclasses
import functools
import ipaddress
import json
import math
import re
import types
import typing
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

PROTOCOL_VERSION = 1

REGISTER_PATH = "/api/v1/agent/register/"
READINGS_PATH = "/api/v1/agent/readings/"
DESIRED_PATH = "/api/v1/agent/desired/"
EVENTS_PATH = "/api/v1/agent/events/"
WEBSOCKET_PATH = "/ws/agent/"

Enforcement = Literal["report", "warn", "kill"]
EventKind = Literal[
    "started",
    "exited",
    "stopped",
    "output",
    "foreign_process",
    "unbooked_process",
    "session_ready",
    "memory_exceeded",
]
# How a job ended without an end of its own (Event.interrupted): "agent_stopped", the node's
# agent stopped it as the agent itself stopped (--stop-jobs-on-exit); "unwatched", it ended while
# no agent watched it and left no exit status. Neither is a success: the portal requeues a batch
# booking with time left and fails any other.
Interruption = Literal["agent_stopped", "unwatched"]
# What an interactive booking runs instead of a command (docs/interactive.md).
Interactive = Literal["jupyterlab", "terminal"]
SESSION_TOKEN_MAX = 128
# The path prefix under which the portal serves a session; the session server is started with it
# as its base URL, so every URL it makes routes back through the portal's proxy.
SESSION_PATH = "/sessions/{booking_id}/"

# The schema's bounds, enforced by from_json on both sides. Lengths are the portal's column sizes
# (a portal test keeps them equal); every string refuses NUL (PostgreSQL text cannot hold it).
UUID_MAX = 96
HOSTNAME_MAX = 253
USER_MAX = 64  # a Unix user name
USERNAME_MAX = 150  # a portal (Django) user name
# A request's command is shorter (portal booking_bounds.COMMAND_MAX); the wire takes any it holds.
COMMAND_MAX = 1_000_000
# Also the request bounds of portal/services/booking/booking_bounds.py (tests/portal/test_request_bounds.py).
MODEL_MAX = 64
PROFILE_MAX = 32
VERSION_MAX = 64
STRING_MAX = 65536
MIG_SLICES = 7
# Integer ranges of the portal's column types (PostgreSQL's; a portal test checks every bounded
# field against the column it lands in), so a value out of range is refused here with the field
# named, not by the database.
INT32 = (-(2**31), 2**31 - 1)  # IntegerField
INT64 = (-(2**63), 2**63 - 1)  # BigIntegerField, primary keys
SMALL_UINT = (0, 2**15 - 1)  # PositiveSmallIntegerField
UINT = (0, 2**31 - 1)  # PositiveIntegerField
FLOAT_LIMIT = 1e9
# How much of a batch job's output (its last bytes) events carry; the booking page says so.
LOG_TAIL_BYTES = 4096
# Items one request may carry (a 400 naming the list and the limit beyond): a node's GPUs, its
# devices' readings (each GPU and MIG instance), processes per device, events per batch.
MAX_GPUS = 64
MAX_READINGS = MAX_GPUS * (1 + MIG_SLICES)
MAX_PROCESSES = 1024
MAX_EVENTS = 500
MAX_BOOKINGS = 4096
# A GPU's topology: NVML's PCI bus id ("00000000:3B:00.0", a 32-byte buffer) and NUMA node.
PCI_BUS_ID_MAX = 32
NUMA_NODE_MAX = 1023
# A node's host resources: CPU cores (Linux's NR_CPUS is at most 8192) and a cpulist such as
# "0-31,64-95" (sysfs's form) per NUMA node.
CPUS_MAX = 8192
CPU_LIST_MAX = 4096
# A batch job's environment (portal booking_bounds holds the same numbers; a portal test checks).
WORKDIR_MAX = 1024
ENV_NAME_MAX = 128
ENV_VALUE_MAX = 4096
# Variables a booking's `env` may not set (the portal refuses them, the agent never exports
# them): the agent sets them for every job, or a container runtime or the NVIDIA container
# toolkit reads them to choose the job's devices, mounts and environment, so a job that set
# them could widen its own devices (docs/distributed.md, "Working directory, variables").
JOB_ENV_RESERVED = frozenset(
    {
        "CUDA_VISIBLE_DEVICES",
        "NVIDIA_VISIBLE_DEVICES",
        "NVIDIA_DRIVER_CAPABILITIES",
        "NVIDIA_MIG_CONFIG_DEVICES",
        "NVIDIA_MIG_MONITOR_DEVICES",
        "NVIDIA_IMEX_CHANNELS",
        "NVIDIA_DISABLE_REQUIRE",
        "MASTER_ADDR",
        "MASTER_PORT",
        "WORLD_SIZE",
        "NODE_RANK",
        "LOCAL_WORLD_SIZE",
        "HOME",
        "USER",
        "LOGNAME",
        "SHELL",
        # The cores and memory the booking got (agents/limits.py); OMP_NUM_THREADS is only a
        # default, a job may set its own.
        "GPU_PORTAL_CPUS",
        "GPU_PORTAL_MEMORY_MIB",
    }
)
JOB_ENV_RESERVED_PREFIXES = (
    "GPU_PORTAL_",
    # MPS: the pipe of the GPU's daemon and the job's share of it (agents/sharing.py).
    "CUDA_MPS_",
    "NVIDIA_REQUIRE_",
    "APPTAINER_",
    "APPTAINERENV_",
    "SINGULARITY_",
    "SINGULARITYENV_",
)


def job_env_reserved(name: str) -> bool:
    """Whether a booking's own variable `name` is one only the agent sets (JOB_ENV_RESERVED)."""
    return name in JOB_ENV_RESERVED or name.startswith(JOB_ENV_RESERVED_PREFIXES)


# RFC 1123: a label is 1-63 letters, digits and hyphens, not starting or ending with a hyphen;
# a host name is labels joined by dots, at most 253 characters. A node's name and address reach
# other nodes' launch lines (MASTER_ADDR, hostfiles), so nothing else may.
_LABEL = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?\Z")


def is_hostname(text: str) -> bool:
    """Whether `text` is an RFC 1123 host name (``gpu-a01``, ``gpu-a01.cluster.example``)."""
    return 0 < len(text) <= HOSTNAME_MAX and all(_LABEL.match(p) for p in text.split("."))


def is_node_address(text: str) -> bool:
    """Whether `text` is an IP address or an RFC 1123 host name: what MASTER_ADDR may be."""
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return is_hostname(text)
    return True


HOSTNAME_RULE = "must be a host name: labels of letters, digits and - joined by dots (RFC 1123)"
ADDRESS_RULE = "must be an IP address or a host name (RFC 1123)"
_FORMS = {"hostname": (is_hostname, HOSTNAME_RULE), "address": (is_node_address, ADDRESS_RULE)}

# The signals a booking may ask for before its end or preemption (Slurm's --signal), by name
# without the SIG prefix; KILL and STOP cannot be caught, so they warn nobody.
WarnSignal = Literal["HUP", "INT", "QUIT", "USR1", "USR2", "TERM", "ALRM", "URG", "CONT", "WINCH"]


def bounded(
    *,
    max_length: int = STRING_MAX,
    low: float | None = None,
    high: float | None = None,
    ints: tuple[int, int] = INT32,
    max_items: int | None = None,
    text: bool | None = None,
    form: str | None = None,
    default: Any = dataclasses.MISSING,
    default_factory: Any = dataclasses.MISSING,
) -> Any:
    """A message field with bounds: strings up to `max_length`, numbers in [low, high], lists
    of at most `max_items`. A `text` string (free text: the long ones by default, such as a
    detail or a log tail) may hold tabs and line breaks; any other string (a name, a UUID, a
    model) refuses every control character, so a CR/LF cannot reach a mail header or a page.
    A `form` string must also be of that form (`_FORMS`: "hostname", "address")."""
    limits = {
        "form": form,
        "max_length": max_length,
        "low": low,
        "high": high,
        "ints": ints,
        "max_items": max_items,
        "text": max_length >= STRING_MAX if text is None else text,
    }
    if default_factory is not dataclasses.MISSING:
        return field(default_factory=default_factory, metadata={"limits": limits})
    return field(default=default, metadata={"limits": limits})


_NO_LIMITS = {
    "max_length": STRING_MAX,
    "low": None,
    "high": None,
    "ints": INT32,
    "max_items": None,
    "text": True,
}
# Control characters: none in a name; in free text only tab, line feed and carriage return.
_CONTROL = {chr(c) for c in range(32)} | {"\x7f"}
_TEXT_CONTROL = _CONTROL - {"\t", "\n", "\r"} - {"\x1b"}  # and ESC: job output has colours


class ProtocolError(ValueError):
    """A message does not match the protocol; `field` names where (e.g. `gpus[0].uuid`)."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}")
        self.field = field
        self.reason = reason


# Container runtimes an agent may report, in the order it prefers them for an OCI image.
CONTAINER_RUNTIMES = ("podman", "docker", "apptainer", "singularity")
IMAGE_MAX = 500
_SIF_TRANSPORTS = ("oras://", "library://", "shub://")


def image_runtimes(image: str) -> tuple[str, ...]:
    """The runtimes that can run ``image``, preferred first: an Apptainer/Singularity image
    (a ``.sif`` file, ``oras://``, ``library://``, ``shub://``) needs one of those two; an OCI
    image (``docker://ref`` or a plain ``registry/name:tag``) runs on any of the four."""
    if image.endswith(".sif") or image.startswith(_SIF_TRANSPORTS):
        return ("apptainer", "singularity")
    return CONTAINER_RUNTIMES


@dataclass(frozen=True)
class MigInventory:
    """One MIG instance as the node discovered it."""

    uuid: str = bounded(max_length=UUID_MAX)
    profile: str = bounded(max_length=PROFILE_MAX)
    slices: int = bounded(low=1, high=MIG_SLICES, ints=SMALL_UINT)
    memory_total_mib: int = bounded(low=0, ints=UINT)
    # NVIDIA's placement start (its first compute slice); None: not known (an older agent, or a
    # driver that does not say), and the portal packs the instances in the order listed.
    placement_start: int | None = bounded(low=0, high=MIG_SLICES - 1, ints=SMALL_UINT, default=None)


@dataclass(frozen=True)
class GpuInventory:
    """One physical GPU and, when MIG mode is on, its MIG instances."""

    index: int = bounded(low=0, ints=SMALL_UINT)
    uuid: str = bounded(max_length=UUID_MAX)
    model: str = bounded(max_length=MODEL_MAX)
    memory_total_mib: int = bounded(low=0, ints=UINT)
    mig_mode: bool = bounded()
    mig_instances: list[MigInventory] = bounded(max_items=MIG_SLICES, default_factory=list)
    # Topology (docs/agent-portal.md); an agent that cannot read it (or predates it) omits it.
    # `nvlink_peers`: the `index` of every GPU of this node it has an active NVLink to.
    pci_bus_id: str | None = bounded(max_length=PCI_BUS_ID_MAX, default=None)
    numa_node: int | None = bounded(low=0, high=NUMA_NODE_MAX, ints=SMALL_UINT, default=None)
    nvlink_peers: list[int] = bounded(
        low=0, high=MAX_GPUS - 1, ints=SMALL_UINT, max_items=MAX_GPUS, default_factory=list
    )


@dataclass(frozen=True)
class MigChangeResult:
    """How the agent's try at a MIG layout change (DesiredMigLayout.change_id) went: the new
    instances themselves are in the register's inventory."""

    change_id: int = bounded(low=0, ints=INT64)
    ok: bool = bounded()
    detail: str = bounded(max_length=300, default="")


@dataclass(frozen=True)
class NumaCpus:
    """The cores of one NUMA node that jobs may use, as a cpulist ("0-31,64-95")."""

    numa_node: int = bounded(low=0, high=NUMA_NODE_MAX, ints=SMALL_UINT)
    cpu_list: str = bounded(max_length=CPU_LIST_MAX)


@dataclass(frozen=True)
class RegisterRequest:
    """POST REGISTER_PATH: the node's inventory, sent at start and after any reconnect."""

    hostname: str = bounded(max_length=HOSTNAME_MAX, form="hostname")
    agent_version: str = bounded(max_length=VERSION_MAX)
    gpus: list[GpuInventory] = bounded(max_items=MAX_GPUS)
    protocol: int = PROTOCOL_VERSION
    # The node's address on the site network (--address): multi-node jobs reach rank 0 there.
    address: str | None = bounded(max_length=HOSTNAME_MAX, form="address", default=None)
    # The container runtimes installed on the node (CONTAINER_RUNTIMES names).
    container_runtimes: list[str] = field(
        default_factory=list, metadata={"limits": {**_NO_LIMITS, "max_length": 32}}
    )
    # The MIG layout changes it tried since its last register (docs/agent.md, MIG layouts).
    mig_changes: list[MigChangeResult] = bounded(max_items=MAX_GPUS, default_factory=list)
    # Host resources jobs may use (docs/agent.md, "Cores and memory"): CPU cores after the
    # site-reserved ones (--reserved-cpus) and host memory after --reserved-memory; None: an
    # agent that predates them. `numa_cpus`: those cores per NUMA node, where sysfs tells.
    cpus: int | None = bounded(low=1, high=CPUS_MAX, ints=UINT, default=None)
    memory_mib: int | None = bounded(low=1, ints=UINT, default=None)
    numa_cpus: list[NumaCpus] = bounded(max_items=NUMA_NODE_MAX + 1, default_factory=list)


@dataclass(frozen=True)
class RegisterResponse:
    """200 answer to a register: the settings the portal wants this node to use."""

    node: str
    report_interval_s: float
    sync_interval_s: float
    enforcement: Enforcement


@dataclass(frozen=True)
class ProcessReading:
    """A process NVML (or the simulator) sees on a device."""

    pid: int = bounded(low=0)
    user: str | None = bounded(max_length=USER_MAX)
    used_memory_mib: int | None = bounded(low=0)
    name: str | None = bounded()
    # The booking whose job the agent knows it for (its process group, or the booking id in
    # the environment the job started with); None: none it launched. On a shared GPU this
    # tells the tenants' processes apart (agents/memshare.py).
    booking_id: int | None = bounded(low=0, ints=INT64, default=None)


@dataclass(frozen=True)
class DeviceReading:
    """One sample of a whole GPU or MIG instance; None means the value is unavailable."""

    uuid: str = bounded(max_length=UUID_MAX)
    utilization_gpu: float | None = bounded(low=0, high=100)
    utilization_memory: float | None = bounded(low=0, high=100)
    memory_used_mib: int | None = bounded(low=0)
    memory_total_mib: int | None = bounded(low=0)
    temperature_c: float | None = bounded()
    power_w: float | None = bounded(low=0)
    processes: list[ProcessReading] = bounded(max_items=MAX_PROCESSES, default_factory=list)
    # Energy used since the driver loaded (NVML's total energy counter), in millijoules.
    energy_mj: int | None = bounded(low=0, ints=INT64, default=None)


@dataclass(frozen=True)
class ReadingsRequest:
    """POST READINGS_PATH: one sample of every device on the node."""

    hostname: str = bounded(max_length=HOSTNAME_MAX, form="hostname")
    time: datetime = bounded()
    readings: list[DeviceReading] = bounded(max_items=MAX_READINGS)


@dataclass(frozen=True)
class EnvVar:
    """One environment variable a booking asked for its command."""

    name: str = bounded(max_length=ENV_NAME_MAX)
    value: str = bounded(max_length=ENV_VALUE_MAX)


@dataclass(frozen=True)
class NodePlace:
    """One node of a booking, in rank order: its name, the address rank 0 is reached at, GPUs."""

    hostname: str = bounded(max_length=HOSTNAME_MAX, form="hostname")
    address: str = bounded(max_length=HOSTNAME_MAX, form="address")
    slots: int = bounded(low=1, ints=SMALL_UINT)


@dataclass(frozen=True)
class DesiredBooking:
    """A booking that holds devices on this node; `command` is launched when set.

    A booking across several nodes lists them all in `nodes` (rank order) and says which one
    this node is (`node_rank`); each node starts its own process, all reaching rank 0 at
    `nodes[0].address`:`master_port` (docs/distributed.md).
    """

    booking_id: int = bounded(low=0, ints=INT64)
    owner: str = bounded(max_length=USERNAME_MAX)
    device_uuids: list[str] = bounded(max_length=UUID_MAX)
    start: datetime = bounded()
    end: datetime = bounded()
    command: str | None = bounded(max_length=COMMAND_MAX, default=None)
    # An interactive session to launch instead of a command, and its per-session secret.
    interactive: Interactive | None = None
    session_token: str | None = bounded(max_length=SESSION_TOKEN_MAX, default=None)
    # The job's environment: working directory (None: the owner's home), extra variables.
    workdir: str | None = bounded(max_length=WORKDIR_MAX, default=None)
    env: list[EnvVar] = field(default_factory=list)
    # Multi-node launch (empty `nodes`: this node alone).
    nodes: list[NodePlace] = field(default_factory=list)
    node_rank: int = bounded(low=0, ints=SMALL_UINT, default=0)
    master_port: int | None = bounded(low=1, high=65535, ints=UINT, default=None)
    # A signal `warn_before_s` seconds before the end (and at a stop before it), then SIGTERM,
    # then SIGKILL `kill_wait_s` later (None: the agent's --grace).
    warn_signal: WarnSignal | None = None
    warn_before_s: int = bounded(low=0, ints=UINT, default=0)
    kill_wait_s: int | None = bounded(low=0, ints=UINT, default=None)
    # How many times the booking went back to the queue and started again.
    restart_count: int = bounded(low=0, ints=UINT, default=0)
    # A task of a job array: the array's id (its first task's booking id) and this task's index.
    array_job_id: int | None = bounded(low=0, ints=INT64, default=None)
    array_task_id: int | None = bounded(low=0, ints=UINT, default=None)
    # Run the command in this container image (agents/containers.py).
    image: str | None = bounded(max_length=IMAGE_MAX, default=None)
    # A fraction of one shared GPU (docs/scheduling.md, "Shared GPUs"): the compute share and
    # the memory the allocation holds on it, which the agent enforces (None: a whole device).
    gpu_fraction: float | None = bounded(low=0, high=1, default=None)
    gpu_memory_mib: int | None = bounded(low=0, ints=UINT, default=None)

    # The CPU cores and host memory the booking got on this node; the agent confines the job
    # to them (a cpuset, a CPU quota, a memory limit: agents/limits.py). None: no limit (a
    # portal that predates them). `cpu_list`: the cores to use (a cpulist); None: the agent
    # picks them, NUMA-local to the booking's GPUs where it can.
    cpus: int | None = bounded(low=1, high=CPUS_MAX, ints=UINT, default=None)
    memory_mib: int | None = bounded(low=1, ints=UINT, default=None)
    cpu_list: str | None = bounded(max_length=CPU_LIST_MAX, default=None)


@dataclass(frozen=True)
class MigSlot:
    """One instance of a MIG layout to create: its profile at NVIDIA's placement `start`, its
    compute `slices` and the memory slices it takes (`size`), and NVML's GPU instance profile
    (`NVML_GPU_INSTANCE_PROFILE_<gi_profile>`) to create it with."""

    profile: str = bounded(max_length=PROFILE_MAX)
    start: int = bounded(low=0, high=MIG_SLICES - 1, ints=SMALL_UINT)
    slices: int = bounded(low=1, high=MIG_SLICES, ints=SMALL_UINT)
    size: int = bounded(low=1, high=MIG_SLICES + 1, ints=SMALL_UINT)
    gi_profile: str = bounded(max_length=PROFILE_MAX)
    memory_mib: int = bounded(low=0, ints=UINT)


@dataclass(frozen=True)
class DesiredMigLayout:
    """Give GPU `gpu_uuid` this MIG layout now (its slices are free): destroy its instances and
    create these, then register again with the result (MigChangeResult)."""

    change_id: int = bounded(low=0, ints=INT64)
    gpu_uuid: str = bounded(max_length=UUID_MAX)
    instances: list[MigSlot] = bounded(max_items=MIG_SLICES)


@dataclass(frozen=True)
class DesiredState:
    """GET DESIRED_PATH: the active bookings on this node, versioned by `generation`, and the
    MIG layout changes to apply now."""

    generation: int = bounded(low=0, ints=INT64)
    bookings: list[DesiredBooking] = bounded(max_items=MAX_BOOKINGS)
    mig_layouts: list[DesiredMigLayout] = bounded(max_items=MAX_GPUS, default_factory=list)


@dataclass(frozen=True)
class Event:
    """Something the agent did or saw: a launch, an exit, a stop, a process it objects to.

    `output` carries the tail of a running batch job's output (`log_tail`), sent with a readings
    cycle when the job's log grew since the last one; `exited` and `stopped` carry the final tail,
    and `interrupted` when the job's end was not its own or not seen (Interruption).
    """

    kind: EventKind
    time: datetime
    detail: str = ""
    booking_id: int | None = bounded(low=0, ints=INT64, default=None)
    exit_code: int | None = bounded(ints=INT32, default=None)
    log_tail: str | None = bounded(default=None)
    device_uuid: str | None = bounded(max_length=UUID_MAX, default=None)
    pid: int | None = bounded(low=0, default=None)
    user: str | None = bounded(max_length=USER_MAX, default=None)
    action: Enforcement | None = None
    # Where an interactive session listens (on `started` and `session_ready`).
    session_host: str | None = bounded(max_length=HOSTNAME_MAX, default=None)
    session_port: int | None = bounded(low=1, high=65535, ints=UINT, default=None)
    # On `exited` and `stopped`: the job did not end by itself, or no one saw how (Interruption).
    interrupted: Interruption | None = None
    # On `exited`: the job's own memory limit killed it (out of memory in its cgroup); the
    # limit it had, in MiB. None: it was not.
    oom_limit_mib: int | None = bounded(low=1, ints=UINT, default=None)


@dataclass(frozen=True)
class EventsRequest:
    """POST EVENTS_PATH: a batch of events, oldest first."""

    events: list[Event] = bounded(max_items=MAX_EVENTS)


@dataclass(frozen=True)
class AcceptedResponse:
    """202 answer to readings and to events: how many items the portal stored."""

    accepted: int


@dataclass(frozen=True)
class PushMessage:
    """What the portal pushes over WEBSOCKET_PATH; the agent then pulls desired state."""

    type: Literal["desired_changed"]
    generation: int = bounded(low=0, ints=INT64)


def memory_text(mib: int) -> str:
    """A memory size as people read it: "64 GiB", "1.5 TiB", "96 MiB"."""
    for unit, size in (("TiB", 1024 * 1024), ("GiB", 1024)):
        if mib >= size:
            return f"{mib / size:.4g} {unit}"
    return f"{mib} MiB"


def oom_reason(limit_mib: int) -> str:
    """Why a job its memory limit killed ended, in the agent's event and on the booking."""
    return f"killed by its memory limit of {memory_text(limit_mib)} (out of memory)"


def output_file_name(booking_id: int, rank: int = 0) -> str:
    """A batch job's stdout and stderr file in its working directory: gpu-portal-<id>.out, and
    gpu-portal-<id>.<rank>.out for the other ranks of a multi-node job (a shared filesystem
    must not mix the nodes' output)."""
    return f"gpu-portal-{booking_id}.out" if rank == 0 else f"gpu-portal-{booking_id}.{rank}.out"


def utcnow() -> datetime:
    """The current time, timezone-aware UTC, as every message carries it."""
    return datetime.now(UTC)


def to_json(message: Any) -> dict[str, Any]:
    """Turn a message dataclass into a JSON-ready dict (datetimes as ISO-8601 UTC)."""
    return {f.name: _encode(getattr(message, f.name)) for f in dataclasses.fields(message)}


def dumps(message: Any) -> bytes:
    """Serialize a message to UTF-8 JSON bytes, ready for an HTTP body."""
    return json.dumps(to_json(message), separators=(",", ":")).encode()


def from_json(cls: type, data: Any, *, strict: bool = False) -> Any:
    """Validate `data` (a dict, or JSON text/bytes) into an instance of message class `cls`.

    Every field is checked against its type and bounds. `strict` also refuses fields the
    message does not have (the portal, reading agents: a typo must not lose data); the agent
    reads the portal's answers leniently, so a newer portal may add fields.
    """
    if isinstance(data, str | bytes | bytearray):
        try:
            data = json.loads(data)
        except ValueError as exc:
            raise ProtocolError("body", f"not JSON: {exc}") from None
    return _decode_dataclass(cls, data, "", strict)


def _encode(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.astimezone(UTC).isoformat().replace("+00:00", "Z")
    if isinstance(value, list):
        return [_encode(item) for item in value]
    if dataclasses.is_dataclass(value):
        return to_json(value)
    return value


@functools.cache
def _fields(cls: type) -> tuple[tuple[dataclasses.Field, Any], ...]:
    # Resolving type hints is slow (string annotations); a portal decodes thousands a second.
    hints = typing.get_type_hints(cls)
    return tuple((f, hints[f.name]) for f in dataclasses.fields(cls))


def _decode_dataclass(cls: type, data: Any, path: str, strict: bool) -> Any:
    if not isinstance(data, dict):
        raise ProtocolError(path or "body", "must be an object")
    fields = _fields(cls)
    if strict:
        known = {f.name for f, _ in fields}
        for key in data:
            if key not in known:
                where = f"{path}.{key}" if path else str(key)
                raise ProtocolError(where, "is not a field of this message")
    kwargs = {}
    for f, hint in fields:
        where = f"{path}.{f.name}" if path else f.name
        if f.name in data:
            limits = f.metadata.get("limits", _NO_LIMITS)
            kwargs[f.name] = _decode(hint, data[f.name], where, limits, strict)
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise ProtocolError(where, "is required")
    return cls(**kwargs)


def _decode(hint: Any, value: Any, where: str, limits: dict, strict: bool) -> Any:
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        if value is None:
            return None
        (inner,) = [arg for arg in typing.get_args(hint) if arg is not type(None)]
        return _decode(inner, value, where, limits, strict)
    if value is None:
        raise ProtocolError(where, "must not be null")
    if origin is list:
        if not isinstance(value, list):
            raise ProtocolError(where, "must be a list")
        most = limits.get("max_items")
        if most is not None and len(value) > most:
            raise ProtocolError(where, f"has {len(value)} items; at most {most} per request")
        (inner,) = typing.get_args(hint)
        return [
            _decode(inner, item, f"{where}[{i}]", limits, strict) for i, item in enumerate(value)
        ]
    if origin is Literal:
        return _decode_choice(typing.get_args(hint), value, where)
    if dataclasses.is_dataclass(hint):
        return _decode_dataclass(hint, value, where, strict)
    return _check_bounds(_decode_scalar(hint, value, where), where, limits)


def _check_bounds(value: Any, where: str, limits: dict) -> Any:
    if isinstance(value, str):
        if len(value) > limits["max_length"]:
            raise ProtocolError(where, f"longer than {limits['max_length']} characters")
        if "\x00" in value:
            raise ProtocolError(where, "must not contain NUL characters")
        if not _CONTROL.isdisjoint(value) and (
            not limits.get("text", True) or not _TEXT_CONTROL.isdisjoint(value)
        ):
            raise ProtocolError(where, "must not contain control characters")
        form = limits.get("form")
        if form is not None and not _FORMS[form][0](value):
            raise ProtocolError(where, _FORMS[form][1])
        return value
    if isinstance(value, bool) or not isinstance(value, int | float):
        return value
    low, high = limits["low"], limits["high"]
    if isinstance(value, float) and (not math.isfinite(value) or abs(value) > FLOAT_LIMIT):
        raise ProtocolError(where, "is out of range")
    if (low, high) == (0, 100) and not low <= value <= high:
        raise ProtocolError(where, "must be a percentage between 0 and 100")
    if low == 0 and high is None and value < 0:
        raise ProtocolError(where, "must not be negative")
    if (low is not None and value < low) or (high is not None and value > high):
        raise ProtocolError(where, f"must be between {low} and {high}")
    ints_low, ints_high = limits["ints"]
    if isinstance(value, int) and not ints_low <= value <= ints_high:
        # The column's range: say the bound that applies (the lower one only if it matters).
        if low is not None and low >= ints_low:
            raise ProtocolError(where, f"must be at most {ints_high}")
        raise ProtocolError(where, f"is out of range ({ints_low} to {ints_high})")
    return value


def _decode_choice(choices: tuple, value: Any, where: str) -> Any:
    if value not in choices:
        raise ProtocolError(where, f"must be one of {', '.join(map(str, choices))}")
    return value


def _decode_scalar(hint: type, value: Any, where: str) -> Any:
    # bool is an int subclass in Python but not in JSON: keep them apart.
    if hint is bool:
        if not isinstance(value, bool):
            raise ProtocolError(where, "must be a boolean")
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ProtocolError(where, "must be an integer")
        return value
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ProtocolError(where, "must be a number")
        return float(value)
    if hint is str:
        if not isinstance(value, str):
            raise ProtocolError(where, "must be a string")
        return value
    if hint is datetime:
        return _decode_time(value, where)
    raise TypeError(f"protocol.py cannot decode {hint!r}")  # a bug here, not bad input


def _decode_time(value: Any, where: str) -> datetime:
    if not isinstance(value, str):
        raise ProtocolError(where, "must be an ISO-8601 string")
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        raise ProtocolError(where, "must be an ISO-8601 string") from None
    if parsed.tzinfo is None:
        raise ProtocolError(where, "must carry a timezone (UTC)")
    try:
        return parsed.astimezone(UTC)
    except OverflowError:  # e.g. year 1 at +01:00: before the first representable UTC time
        raise ProtocolError(where, "is out of range") from None
