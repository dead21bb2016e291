"""Frozen dataclasses that go into and come out of the allocator.

All times are float seconds (since the epoch, or since the start of a trace): the allocator has no
clock of its own, ``State.now`` is an input like everything else.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

# Why a pending booking is not starting now (``Planned.reason``).
REASON_STARTING = "starting"  # starts in this pass: listed in Plan.starts too
REASON_PRIORITY = "priority"  # devices are free now but held for higher-priority bookings
REASON_RESOURCES = "resources"  # matching devices are busy with running allocations
REASON_RESERVATION = "reservation"  # an advance reservation is in the way
REASON_QUOTA = "quota"  # a user/project concurrency limit or GPU-hour budget holds it back
REASON_NODE_DOWN = "node_down"  # it would fit now if down/draining nodes were up
REASON_PREEMPTING = "preempting"  # lower-QOS bookings are being preempted to make room for it
REASON_NEVER = "never"  # no set of up-or-down devices in the cluster can ever hold it
REASONS = (
    REASON_STARTING,
    REASON_PRIORITY,
    REASON_RESOURCES,
    REASON_RESERVATION,
    REASON_QUOTA,
    REASON_NODE_DOWN,
    REASON_PREEMPTING,
    REASON_NEVER,
)

NODE_UP = "up"
NODE_DOWN = "down"
NODE_DRAIN = "drain"


@dataclass(frozen=True)
class Device:
    """One allocatable device: a whole GPU (profile None) or a MIG instance (profile "3g.40gb").

    ``fraction`` is the device in GPU-equivalents (slices/7 for a MIG instance). ``parent`` names
    the physical GPU a MIG instance lives on, so placement can keep whole GPUs free.
    """

    id: str
    node: str
    model: str
    profile: str | None = None
    fraction: float = 1.0
    node_state: str = NODE_UP
    temperature_c: float | None = None
    utilization: float | None = None
    parent: str = ""


@dataclass(frozen=True)
class Allocation:
    """Devices held by a booking over [start, end).

    Running, or (running=False) an advance reservation: a fixed future block.
    """

    booking_id: str
    device_ids: tuple[str, ...]
    start: float
    end: float
    user: str
    project: str
    qos: str = "normal"
    preemptible: bool = False
    running: bool = True


@dataclass(frozen=True)
class Request:
    """A pending booking. With ``mig_profile`` set, ``gpus`` is 1 and means one MIG instance."""

    booking_id: str
    user: str
    project: str
    submit_time: float
    duration_s: float
    gpus: int = 1
    mig_profile: str | None = None
    gpu_model: str | None = None
    qos: str = "normal"
    preemptible: bool = False


@dataclass(frozen=True)
class Quota:
    """Limits of one user or project: concurrent GPU-equivalents and a GPU-hour budget."""

    max_gpus: float | None = None
    gpu_hours_budget: float | None = None
    gpu_hours_used: float = 0.0


def _frozen(mapping: Mapping) -> Mapping:
    return MappingProxyType(dict(mapping))


DEFAULT_QOS_LEVELS = (("low", 0), ("normal", 1), ("high", 2))


@dataclass(frozen=True)
class Policy:
    """Settings of the allocator.

    Priority is ``sum(weight_x * factor_x)`` with every factor in [0, 1] (Slurm multifactor).
    ``backfill``: "conservative" (every booking up to ``reservation_depth`` gets a reservation that
    later ones may not delay), "easy" (only the first booking gets one) or "none" (strict order).
    ``size_scale_gpu_s``: the size factor is 1 / (1 + gpu-equivalents * duration / scale), so small,
    short bookings rank higher (``size_by="seconds"``: by duration alone, in seconds against the
    same scale). ``size_width_gpus``: GPU-seconds count ``gpus / size_width_gpus`` of their value,
    so a booking as wide as that is measured on the plain scale and a narrower one ranks
    higher the narrower it is (None: plain GPU-seconds). ``age_max_s`` is where the age factor
    saturates at 1. With
    ``size_fades_with_age`` the size bonus shrinks as (1 - age factor): with weight_age >=
    weight_size, a booking older than age_max_s outranks every younger one and old bookings go in
    arrival order, so small jobs jump the queue only while young and nobody starves.
    ``starve_after_s``: bookings pending at least this long rank ahead of all others, in arrival
    order (an anti-starvation guard on top of the factors), if they ask at most
    ``starve_max_share`` of the GPU-equivalents on up nodes: a wider booking put first holds that
    much of the cluster idle while it drains, and everyone behind it waits its whole run.
    ``estimate_all=False`` skips the planned start of bookings past the reservation depth that
    cannot start now (start None): the same decisions, a cheaper pass (used by replay baselines).
    """

    weight_age: float = 1000.0
    weight_fairshare: float = 500.0
    weight_size: float = 1000.0
    weight_qos: float = 2000.0
    age_max_s: float = 7 * 86400.0
    # Large enough that whole-node jobs of hours still rank above whole-node jobs of days.
    size_scale_gpu_s: float = 640 * 3600.0
    size_fades_with_age: bool = True
    size_by: str = "gpu_seconds"
    # A 64-GPU booking is measured on the plain scale; 8 GPUs x 10 days ranks like 1,920 GPU-hours
    # of 64-GPU work would not: it needs one node, not eight.
    size_width_gpus: float | None = 64.0
    starve_after_s: float | None = 1.25 * 86400.0
    starve_max_share: float = 0.1
    fairshare_half_life_s: float = 7 * 86400.0
    qos_levels: tuple[tuple[str, int], ...] = DEFAULT_QOS_LEVELS
    preempt_grace_s: float = 300.0
    backfill: str = "conservative"
    reservation_depth: int | None = None
    estimate_all: bool = True

    def qos_level(self, qos: str) -> int:
        """The numeric level of a QOS name (unknown names rank lowest)."""
        return dict(self.qos_levels).get(qos, 0)


@dataclass(frozen=True)
class State:
    """Everything the allocator looks at in one pass."""

    now: float
    devices: tuple[Device, ...]
    allocations: tuple[Allocation, ...] = ()
    pending: tuple[Request, ...] = ()
    project_shares: Mapping[str, float] = field(default_factory=lambda: _frozen({}))
    project_usage: Mapping[str, float] = field(default_factory=lambda: _frozen({}))
    user_quotas: Mapping[str, Quota] = field(default_factory=lambda: _frozen({}))
    project_quotas: Mapping[str, Quota] = field(default_factory=lambda: _frozen({}))


@dataclass(frozen=True)
class Priority:
    """A booking's priority and the weighted factors it is the sum of."""

    total: float
    age: float
    fairshare: float
    size: float
    qos: float


@dataclass(frozen=True)
class Start:
    """Start this booking now on these devices."""

    booking_id: str
    device_ids: tuple[str, ...]


@dataclass(frozen=True)
class Planned:
    """Where a pending booking stands: planned start and devices, queue position, why it waits.

    ``start`` is None when no start can be planned: reason "never", "node_down" with no up node
    that fits, "quota" with a spent budget or a limit below the request, or a booking past
    ``reservation_depth`` under ``estimate_all=False``. Past ``reservation_depth`` otherwise,
    ``start`` is an estimate and ``device_ids`` is empty (nothing is held for it).
    ``position`` is 1-based in priority order.
    """

    booking_id: str
    start: float | None
    device_ids: tuple[str, ...]
    position: int
    reason: str
    detail: str
    priority: Priority


@dataclass(frozen=True)
class Preemption:
    """Stop ``booking_id`` so that ``for_booking_id`` can start."""

    booking_id: str
    for_booking_id: str


@dataclass(frozen=True)
class Plan:
    """The result of one allocation pass."""

    starts: tuple[Start, ...]
    planned: tuple[Planned, ...]
    preemptions: tuple[Preemption, ...]
