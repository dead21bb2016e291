"""Frozen dataclasses that go into and come out of the allocator.

All times are float seconds (since the epoch, or since the start of a trace): the allocator has no
clock of its own, ``State.now`` is an input like everything else.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
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
REASON_DEPENDENCY = "dependency"  # a booking it depends on has not ended (or ended the wrong way)
REASON_ARRAY_LIMIT = "array_limit"  # its array already runs as many tasks as the array allows
# It could start now, but waits (at most Policy.topology_wait_s) for a better-connected GPU set.
REASON_TOPOLOGY = "topology"
# A maintenance window on the nodes that could hold it lies in the way (``State.windows``).
REASON_MAINTENANCE = "maintenance"
# Its devices are free, but a planned MIG layout change of their GPU comes first (the detail
# names the GPU and when).
REASON_MIG_CHANGE = "mig_change"
# Capacity is set aside for a project (a project reservation): outsiders wait until its window
# ends, or a member's booking is planned on its project's reservation when the window opens.
REASON_PROJECT_RESERVATION = "project_reservation"
# The devices of a node fit, but its free CPU cores or host memory do not (scheduler/resources.py).
REASON_CPUS = "cpus"
REASON_MEMORY = "memory"
REASONS = (
    REASON_STARTING,
    REASON_PRIORITY,
    REASON_RESOURCES,
    REASON_RESERVATION,
    REASON_QUOTA,
    REASON_NODE_DOWN,
    REASON_PREEMPTING,
    REASON_NEVER,
    REASON_DEPENDENCY,
    REASON_ARRAY_LIMIT,
    REASON_TOPOLOGY,
    REASON_MAINTENANCE,
    REASON_MIG_CHANGE,
    REASON_PROJECT_RESERVATION,
    REASON_CPUS,
    REASON_MEMORY,
)

# Dependency kinds (Slurm's): start after the target ended successfully, in any way, or not
# successfully. ``State.outcomes`` says how each ended target ended.
AFTER_OK = "afterok"
AFTER_ANY = "afterany"
AFTER_NOT_OK = "afternotok"
AFTER_KINDS = (AFTER_OK, AFTER_ANY, AFTER_NOT_OK)
OUTCOME_OK = "ok"
OUTCOME_NOT_OK = "notok"

NODE_UP = "up"
NODE_DOWN = "down"
NODE_DRAIN = "drain"
# Drained for a maintenance window: planned on again from the window's end (scheduler/calendar.py).
NODE_MAINTENANCE = "maintenance"


@dataclass(frozen=True)
class Device:
    """One allocatable device: a whole GPU (profile None) or a MIG instance (profile "3g.40gb").

    ``fraction`` is the device in GPU-equivalents (slices/7 for a MIG instance). ``parent`` names
    the physical GPU a MIG instance lives on, so placement can keep whole GPUs free.
    Topology (docs/scheduling.md, Placement): ``links`` are the ids of the devices of its node it
    has an NVLink to, ``numa`` its NUMA node (None: unknown), ``group`` its node's network group
    (rack or switch; "": none).
    ``shared``: a whole GPU in sharing mode, offered only to fractional requests (and those only
    go to shared GPUs); ``memory_mib`` its memory, which the fractions on it share
    (scheduler/sharing.py).
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
    runtimes: tuple[str, ...] = ()  # container runtimes of its node
    links: tuple[str, ...] = ()
    numa: int | None = None
    group: str = ""
    shared: bool = False
    memory_mib: int = 0


@dataclass(frozen=True, slots=True)
class NodeResources:
    """What one node offers jobs: ``cpus`` cores (the site-reserved ones taken off by its
    agent) and ``memory_mib`` of host memory, and how many whole GPUs it has (``gpus``: the
    proportional default's denominator, scheduler/resources.py)."""

    cpus: int
    memory_mib: int
    gpus: int


@dataclass(frozen=True)
class Window:
    """A maintenance window: no booking holds a device of ``nodes`` (node names) over any of
    [start, end). ``id`` and ``reason`` name it in the reason of a booking it moves."""

    id: str
    reason: str
    start: float
    end: float
    nodes: tuple[str, ...] = ()


@dataclass(frozen=True)
class Allocation:
    """Devices held by a booking over [start, end).

    Running, or (running=False) an advance reservation: a fixed future block.
    ``share`` < 1: a fraction of one shared GPU, holding that much of its compute and
    ``gpu_memory_mib`` of its memory.
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
    array: str = ""
    share: float = 1.0
    gpu_memory_mib: int = 0
    # Started past a concurrency limit on devices no booking within its limits could use
    # (scheduler/borrowing.py): it counts against no concurrency limit, only against
    # ``Quota.max_borrow_gpus``, and may be reclaimed.
    borrowed: bool = False
    # CPU cores and host memory per node it asked for (None: the default, resources.node_demand).
    cpus: int | None = None
    memory_mib: int | None = None


@dataclass(frozen=True)
class Dependency:
    """Start only after booking ``booking_id`` ended: ``kind`` is one of ``AFTER_KINDS``."""

    kind: str
    booking_id: str


@dataclass(frozen=True)
class Request:
    """A pending booking. With ``mig_profile`` set, ``gpus`` is 1 and means one MIG instance.

    ``after``: bookings that must end first (all of them, each the way its kind says).
    ``array``: the array this booking is a task of ("": none); at most ``array_limit`` tasks of
    one array hold devices at once (None: no limit). Tasks of one array have the same shape.
    ``runtimes``: it runs in a container image, so only devices of nodes with one of these
    container runtimes fit (empty: any node).
    ``mixed_models``: its GPUs may be of several models. Without it, a request of 2 or more
    whole GPUs that names no model gets GPUs of one model (``placement.keeps_one_model``).
    ``gpu_fraction`` / ``gpu_memory_mib`` (either or both; ``gpus`` is 1): a fraction of one
    shared GPU, a compute share 0 < f < 1 and the memory it needs (``sharing.share_on``).
    """

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
    after: tuple[Dependency, ...] = ()
    array: str = ""
    array_limit: int | None = None
    runtimes: tuple[str, ...] = ()  # it runs in a container: its node needs one of these
    mixed_models: bool = False  # any models will do: no one-model rule
    # It may not start borrowed before then: the backoff after a reclaim (``borrow_backoff``).
    borrow_after: float = 0.0
    gpu_fraction: float | None = None
    gpu_memory_mib: int | None = None
    # CPU cores and host memory per node (None: the default, resources.node_demand).
    cpus: int | None = None
    memory_mib: int | None = None

    @property
    def fractional(self) -> bool:
        """It asks for a fraction of one shared GPU."""
        return self.gpu_fraction is not None or self.gpu_memory_mib is not None

    @property
    def device_match(self) -> str | None | tuple:
        """What a device must match besides the MIG profile: the model, and with ``runtimes``
        a node that has one of them; with ``mixed_models`` it says so too (a search for it
        differs from one for GPUs of one model). One value, so every cache keyed by it tells
        them apart."""
        if self.fractional:
            share = ("shared", self.gpu_fraction, self.gpu_memory_mib)
            return (self.gpu_model, self.runtimes, self.mixed_models, share)
        if self.runtimes or self.mixed_models:
            return (self.gpu_model, self.runtimes, self.mixed_models)
        return self.gpu_model


@dataclass(frozen=True)
class Quota:
    """Limits of one user or project: concurrent GPU-equivalents and a GPU-hour budget.

    ``max_gpus`` is the guaranteed share. With ``borrowing``, a booking held back only by it
    may start *borrowed* on devices no booking within its limits can use now, up to
    ``max_borrow_gpus`` borrowed GPU-equivalents at once (None: any); the budget is never
    borrowed past (scheduler/borrowing.py).
    """

    max_gpus: float | None = None
    gpu_hours_budget: float | None = None
    gpu_hours_used: float = 0.0
    borrowing: bool = False
    max_borrow_gpus: float | None = None
    # Concurrent CPU cores and host memory (None: no limit), as ``max_gpus`` limits GPUs.
    max_cpus: int | None = None
    max_memory_mib: int | None = None


def _frozen(mapping: Mapping) -> Mapping:
    return MappingProxyType(dict(mapping))


DEFAULT_QOS_LEVELS = (("low", 0), ("normal", 1), ("high", 2))


BACKFILL_MODES = ("conservative", "easy", "none")
# The order of the walk among unprotected bookings (``Policy.order``): the multifactor priority,
# arrival, smallest GPU-seconds first, or highest response ratio (wait + duration) / duration.
ORDERS = ("priority", "arrival", "sjf", "hrrn")
SIZE_BY = ("gpu_seconds", "seconds")
# What a project's fair-share usage charges for each allocated GPU-second (``fairshare_charge``).
FAIRSHARE_CHARGES = ("allocated", "measured", "blend")


@dataclass(frozen=True)
class Policy:
    """Settings of the allocator.

    Priority is ``sum(weight_x * factor_x)`` with every factor in [0, 1] (Slurm multifactor).
    ``backfill``: "conservative" (every booking up to ``reservation_depth`` gets a reservation that
    later ones may not delay), "easy" (the default: only the first booking that cannot start
    gets one) or "none" (strict order).
    A protected booking always holds its reservation and counts towards the depth.
    ``order``: how unprotected bookings are walked: "priority" (the multifactor priority below),
    "arrival" (oldest first), "sjf" (smallest GPU-equivalents x duration first) or "hrrn" (the
    default: highest response ratio (waited + duration) / duration first); besides "priority", a
    higher QOS level goes first, ties go to the older booking, and the priority is only shown.

    Scales are relative to the site, not to a trace. The *typical run* R of a pass is the
    ``run_quantile`` quantile of the requested durations of the running allocations (at least
    ``run_floor_s``; ``run_floor_s`` alone when nothing runs). Capacity C is the GPU-equivalents
    on up nodes.

    - size factor = 1 / (1 + gpu-equivalents * duration * width_weight / scale), scale =
      ``size_scale_share`` * C * R GPU-seconds (``size_by="seconds"``: duration alone against
      ``size_scale_share`` * R); width_weight = gpu-equivalents / (``size_width_share`` * C)
      (None: 1), so a booking that wide is measured on the plain scale and a narrower one ranks
      higher the narrower it is.
    - age factor = min(1, waited / (``age_max_runs`` * R)). With ``size_fades_with_age`` the size
      bonus shrinks as (1 - age factor).
    - protection: the ``protect_oldest`` oldest pending bookings (one that starts in the pass
      hands its place to the next oldest), and a booking pending ``protect_after_runs`` * R, or
      ``protect_after_max_s`` if that is shorter (``protect_after_runs=inf``: that absolute
      threshold), are *protected*: protected bookings go ahead of every other in arrival
      order and each holds a reservation that no later booking can delay (None: off). This is
      the no-starvation bound of docs/scheduling.md.
    - ``age_max_s``, ``size_scale_gpu_s``, ``size_width_gpus``: absolute overrides of the
      relative scales (None: relative).
    ``estimate_all=False`` skips the planned start of bookings past the reservation depth that
    cannot start now (start None): the same decisions, a cheaper pass (used by replay baselines).
    ``predict_last`` > 0: callers (the portal's snapshot, the replay) plan a pending booking
    with the mean run time of its user's last ``predict_last`` completed bookings, capped by the
    requested duration, which stays the hard end; 0: the requested duration.
    ``fairshare_charge``: what each allocated GPU-second adds to a project's fair-share usage.
    "allocated" charges it in full; "measured" charges it times the device's mean utilization
    over the allocation, at least ``fairshare_idle_floor`` (so holding an idle GPU still costs);
    "blend" charges ``fairshare_blend`` * allocated + (1 - ``fairshare_blend``) * measured. An
    allocation with no utilization measured (a MIG slice, which NVML does not report, or a node
    that sent nothing) is charged in full: missing telemetry earns no discount.
    ``topology_wait_s`` > 0: a request of 2 or more GPUs on one node whose best set at its
    earliest start is not the best-connected its nodes offer may start up to that many seconds
    later on a better-connected set (reason "topology"); never a protected booking. 0 (the
    default): placement quality never delays a start.
    ``reclaim_grace_s``: the longest a booking within its limits waits because borrowed
    bookings hold the devices it needs; ``reclaim_warning_s`` of it is the warning a reclaimed
    booking gets before it stops (the portal's JOB_KILL_WAIT_S). A booking pending
    ``reclaim_grace_s - reclaim_warning_s`` that would not start within its grace reclaims
    (scheduler/borrowing.py).
    ``explain=False`` leaves the reason of a waiting booking at "resources" with no detail
    instead of working it out: the same decisions, a cheaper pass (used by the replay).
    """

    weight_age: float = 1000.0
    weight_fairshare: float = 500.0
    weight_size: float = 1000.0
    weight_qos: float = 2000.0
    run_quantile: float = 0.5
    run_floor_s: float = 3600.0
    age_max_runs: float = 21.0
    size_scale_share: float = 1.0
    size_width_share: float | None = 0.75
    size_fades_with_age: bool = True
    size_by: str = "gpu_seconds"
    protect_after_runs: float | None = None
    protect_after_max_s: float = 1.25 * 86400.0
    protect_oldest: int = 1
    age_max_s: float | None = None
    size_scale_gpu_s: float | None = None
    size_width_gpus: float | None = None
    fairshare_half_life_s: float = 7 * 86400.0
    fairshare_charge: str = "allocated"
    fairshare_idle_floor: float = 0.25
    fairshare_blend: float = 0.5
    qos_levels: tuple[tuple[str, int], ...] = DEFAULT_QOS_LEVELS
    preempt_grace_s: float = 300.0
    backfill: str = "easy"
    order: str = "hrrn"
    reservation_depth: int | None = None
    estimate_all: bool = True
    explain: bool = True
    predict_last: int = 0
    topology_wait_s: float = 0.0
    reclaim_grace_s: float = 300.0
    reclaim_warning_s: float = 0.0
    # Cores and host memory per GPU-equivalent of a booking that names none (the portal's
    # SCHEDULER_DEFAULT_CPUS_PER_GPU, SCHEDULER_DEFAULT_MEMORY_MIB_PER_GPU); None: the node's
    # share in proportion to the GPUs booked (scheduler/resources.py).
    default_cpus_per_gpu: float | None = None
    default_memory_mib_per_gpu: int | None = None

    def __post_init__(self) -> None:
        problems = policy_problems(self)
        if problems:
            raise ValueError("; ".join(problems))

    def qos_level(self, qos: str) -> int:
        """The numeric level of a QOS name (unknown names rank lowest)."""
        return dict(self.qos_levels).get(qos, 0)


def policy_problems(policy: Policy) -> list[str]:
    """Every invalid field of a policy, one line each naming the field (empty: valid)."""
    problems = []
    if policy.backfill not in BACKFILL_MODES:
        problems.append(
            f"backfill must be one of {', '.join(BACKFILL_MODES)}, not {policy.backfill!r}"
        )
    if policy.order not in ORDERS:
        problems.append(f"order must be one of {', '.join(ORDERS)}, not {policy.order!r}")
    if policy.size_by not in SIZE_BY:
        problems.append(f"size_by must be one of {', '.join(SIZE_BY)}, not {policy.size_by!r}")
    if policy.fairshare_charge not in FAIRSHARE_CHARGES:
        problems.append(
            f"fairshare_charge must be one of {', '.join(FAIRSHARE_CHARGES)},"
            f" not {policy.fairshare_charge!r}"
        )
    for name in ("fairshare_idle_floor", "fairshare_blend"):
        if not 0 <= getattr(policy, name) <= 1:
            problems.append(f"{name} must be in [0, 1]")
    for name in (
        "weight_age",
        "weight_fairshare",
        "weight_size",
        "weight_qos",
        "preempt_grace_s",
        "topology_wait_s",
        "reclaim_grace_s",
        "reclaim_warning_s",
    ):
        if not getattr(policy, name) >= 0:
            problems.append(f"{name} must be >= 0")
    positive = (
        "run_floor_s",
        "age_max_runs",
        "size_scale_share",
        "fairshare_half_life_s",
        "protect_after_max_s",
    )
    optional = (
        "default_cpus_per_gpu",
        "default_memory_mib_per_gpu",
        "size_width_share",
        "age_max_s",
        "size_scale_gpu_s",
        "size_width_gpus",
    )
    for name in positive + optional:
        value = getattr(policy, name)
        if not (value is None and name in optional) and not (value is not None and value > 0):
            problems.append(f"{name} must be > 0")
    if not policy.reclaim_warning_s <= policy.reclaim_grace_s:
        problems.append("reclaim_grace_s must be at least reclaim_warning_s (the warning)")
    if policy.protect_after_runs is not None and not policy.protect_after_runs >= 0:
        problems.append("protect_after_runs must be >= 0")
    if not 0 < policy.run_quantile <= 1:
        problems.append("run_quantile must be in (0, 1]")
    if policy.protect_oldest < 0:
        problems.append("protect_oldest must be >= 0")
    if policy.predict_last < 0:
        problems.append("predict_last must be >= 0")
    if policy.reservation_depth is not None and policy.reservation_depth < 1:
        problems.append("reservation_depth must be >= 1")
    levels = [name for name, _ in policy.qos_levels]
    if not levels or len(set(levels)) != len(levels):
        problems.append("qos_levels must name at least one level, each once")
    return problems


@dataclass(frozen=True)
class MigChange:
    """A new layout staff asked for on physical GPU ``gpu`` (the ``parent`` of its slices, a
    device id); ``label`` names it for people ("gpu-a03/gpu4")."""

    gpu: str
    label: str = ""

    def detail(self, at: float) -> str:
        """ "gpu-a03/gpu4 changes its MIG layout at 2026-12-04 19:30 UTC" """
        moment = datetime.fromtimestamp(at, UTC)
        return f"{self.label or self.gpu} changes its MIG layout at {moment:%Y-%m-%d %H:%M} UTC"


@dataclass(frozen=True)
class ProjectHold:
    """Devices set aside for project ``project`` over [start, end): one occurrence of a project
    reservation (``scheduler.holds.expand`` makes them from the reservations' rules).

    Only the project's bookings may use the devices during the window; an outsider's booking
    on them must end by ``start``. A member's booking that lies on them, inside the window,
    draws on the reservation and is not counted against concurrency limits.
    """

    hold_id: str
    project: str
    start: float
    end: float
    device_ids: tuple[str, ...]


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
    # How the ended targets of pending bookings' dependencies ended: OUTCOME_OK or
    # OUTCOME_NOT_OK. A target not named here (and not pending) is taken as still running.
    outcomes: Mapping[str, str] = field(default_factory=lambda: _frozen({}))
    # Maintenance windows (scheduler/calendar.py): their nodes take no booking that would
    # overlap them; a node drained for one (NODE_MAINTENANCE) is planned on from its end.
    windows: tuple[Window, ...] = ()
    # Pending MIG layout changes (scheduler.mig_layout.change_times says when each happens).
    mig_changes: tuple[MigChange, ...] = ()
    # Project reservations' concrete windows (empty: none, today's behaviour).
    holds: tuple[ProjectHold, ...] = ()
    # CPU cores and host memory of each node by name (scheduler/resources.py); a node not
    # named counts neither (empty: GPUs alone, today's behaviour).
    node_resources: Mapping[str, NodeResources] = field(default_factory=lambda: _frozen({}))


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
    """Start this booking now on these devices (a fraction of a shared GPU: holding ``share``
    of its compute and ``gpu_memory_mib`` of its memory, ``sharing.share_on``).

    ``borrowed_past``: it starts borrowed, past these concurrency limits (ledger labels such as
    "project vision"; empty: within its limits).
    """

    booking_id: str
    device_ids: tuple[str, ...]
    share: float = 1.0
    gpu_memory_mib: int = 0
    borrowed_past: tuple[str, ...] = ()

    @property
    def borrowed(self) -> bool:
        """It starts borrowed: preemptible, and reclaimed when a booking within its limits
        needs the devices."""
        return bool(self.borrowed_past)


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
    """Stop ``booking_id`` so that ``for_booking_id`` can start.

    ``reason``: why, when it is not a higher QOS ("reclaimed for project nlp's quota").
    """

    booking_id: str
    for_booking_id: str
    reason: str = ""


@dataclass(frozen=True)
class Plan:
    """The result of one allocation pass."""

    starts: tuple[Start, ...]
    planned: tuple[Planned, ...]
    preemptions: tuple[Preemption, ...]
    # Pending bookings whose dependencies can never be met (their Planned line says why): the
    # caller ends them.
    never_met: tuple[str, ...] = ()
