"""Reads for the browser pages: devices with their state, what is mine, site totals.

Selectors only read. Pure helpers (no ORM) sit at the bottom so they test without a database.
"""

from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.db.models import Count, Prefetch, Sum

from portal.models import (
    Allocation,
    Booking,
    Gpu,
    MigInstance,
    Node,
    NodeAlert,
    NodeRun,
    ProcessUsage,
)
from portal.models.inventory import mig_label
from portal.services.booking.selectors import visible_bookings
from portal.services.inventory import selectors as inventory
from portal.services.inventory.telemetry_cache import latest_by_uuid
from portal.web.device_usage import busy_devices
from portal.web.tenants import tenant_lines

# A device whose reading shows processes, or more than this utilization, is "in use".
STATE_LABELS = {
    "in_use": "in use",
    "unbooked": "in use, unbooked",
    "retired": "retired (no longer reported)",
}

# The states the pages filter devices by.
FILTER_STATES = ("free", "booked", "in_use", "unbooked", "down")

PENDING_REASONS = {
    "resources": "Waiting for enough free devices of the kind asked for.",
    "reservation": "Devices are held for a reservation that starts before this could finish.",
    "quota": "Your project is at a quota limit; it starts when usage drops.",
    "priority": "Requests with a higher priority are ahead in the queue.",
    "node_down": "The nodes that could run it are down or draining.",
    "dependency": "It starts after other bookings end (its dependencies).",
    "array_limit": "Its array already runs as many tasks at once as the array allows.",
    "topology": "It waits a little (at most the site's limit) for better-connected GPUs.",
    "maintenance": "A maintenance window on the nodes that could run it is in the way; it is "
    "planned around the window.",
    "mig_change": "The GPU it fits on changes its MIG layout first (the detail says when).",
    "project_reservation": "Devices are set aside for a project (a project reservation) then.",
    "cpus": "Its GPUs are free, but not the CPU cores it asks on their node (the detail says "
    "how many are free).",
    "memory": "Its GPUs are free, but not the host memory it asks on their node.",
}


@dataclass
class DeviceRow:
    """One bookable device (a whole GPU, or a MIG slice) as the overview and calendar show it."""

    uuid: str
    label: str
    node: str
    node_state: str
    gpu_id: int
    model: str
    profile: str
    memory_mib: int
    is_mig: bool
    mig_id: int | None = None
    state: str = "free"
    booking: Booking | None = None
    reading: dict | None = None
    children: list = field(default_factory=list)
    topology: str = ""  # a whole GPU's NUMA node and NVLink peers, as its agent reported them
    shared: bool = False  # a GPU in sharing mode: fractions to several bookings
    tenants: list = field(default_factory=list)  # a shared GPU's bookings now (web.tenants)

    @property
    def short_label(self) -> str:
        """The label without its node and GPU: a MIG slice's `1g.10gb@5` under its GPU's row."""
        return self.label.rsplit("/", 1)[-1]

    @property
    def state_label(self) -> str:
        return STATE_LABELS.get(self.state, self.state)


def device_state(
    *,
    node_state: str,
    booking: Booking | None,
    reading: dict | None,
    busy: bool = False,
    retired: bool = False,
) -> str:
    """free / booked / in_use / unbooked / down: what a researcher needs to know about a device
    now. "unbooked": processes on it that no booking accounts for (not free, whatever it says).
    A booked device is "in_use" with processes on it, or when `busy` (device_usage: utilization
    with hysteresis, so idle noise does not flip it). "retired": its agent no longer reports it
    (shown only where history is, e.g. the GPU's own page); never offered."""
    if retired:
        return "retired"
    if node_state != Node.State.UP:
        return "down"
    if booking is None:
        return "unbooked" if reading and reading.get("processes") else "free"
    if busy or (reading and reading.get("processes")):
        return "in_use"
    return "booked"


def _current_allocations(
    now: datetime, gpu_ids: list[int] | None = None
) -> tuple[dict, dict, dict]:
    """Live allocations covering now (on `gpu_ids` only, if given): bookings keyed by whole-GPU
    id and by MIG-instance id, and a shared GPU's fractional allocations by GPU id."""
    rows = Allocation.objects.filter(live=True, start__lte=now, end__gt=now).select_related(
        "booking__owner", "booking__project"
    )
    if gpu_ids is not None:
        rows = rows.filter(gpu_id__in=gpu_ids)
    by_gpu, by_mig, shared = {}, {}, {}
    for allocation in rows.order_by("id"):
        if allocation.mig_instance_id:
            by_mig[allocation.mig_instance_id] = allocation.booking
        else:
            by_gpu.setdefault(allocation.gpu_id, allocation.booking)
            if allocation.share < 1:
                shared.setdefault(allocation.gpu_id, []).append(allocation)
    return by_gpu, by_mig, shared


def device_rows(
    *, now: datetime, gpu_id: int | None = None, hostnames: list[str] | None = None
) -> list[DeviceRow]:
    """Every live GPU (those of the nodes `hostnames`, or just `gpu_id`, even retired) and,
    under a GPU in MIG mode, each bookable slice, with booking, reading and state."""
    gpus = inventory.gpus_live() if gpu_id is None else Gpu.objects.filter(pk=gpu_id)
    if hostnames is not None:
        gpus = gpus.filter(node__hostname__in=hostnames)
    slices = inventory.mig_instances_bookable().order_by("-slices", "uuid")
    gpus = gpus.select_related("node").prefetch_related(Prefetch("mig_instances", slices))
    gpus = list(gpus.order_by("node__hostname", "index"))
    uuids = [g.uuid for g in gpus] + [m.uuid for g in gpus for m in g.mig_instances.all()]
    readings = latest_by_uuid(uuids)
    whole_site = gpu_id is None and hostnames is None
    by_gpu, by_mig, shared = _current_allocations(now, None if whole_site else [g.pk for g in gpus])
    booked = [g.uuid for g in gpus if g.pk in by_gpu] + [
        m.uuid for g in gpus for m in g.mig_instances.all() if m.pk in by_mig
    ]
    busy = busy_devices(uuids=booked, latest=readings, now=now)
    rows = []
    for gpu in gpus:
        row = _gpu_row(gpu, readings, by_gpu.get(gpu.pk), busy)
        row.tenants = tenant_lines(shared.get(gpu.pk, []), readings.get(gpu.uuid))
        for mig in gpu.mig_instances.all():
            row.children.append(_mig_row(gpu, mig, readings, by_mig.get(mig.pk), busy))
        if row.children:
            row.state = _parent_state(row)
        rows.append(row)
    return rows


def device_row(*, now: datetime, gpu_id: int, mig_id: int | None = None) -> DeviceRow | None:
    """One GPU's row, or one of its slices' (`mig_id`): the same state the overview shows."""
    rows = device_rows(now=now, gpu_id=gpu_id)
    if not rows:
        return None
    if mig_id is None:
        return rows[0]
    return next((c for c in rows[0].children if c.mig_id == mig_id), None)


def _gpu_row(gpu: Gpu, readings: dict, booking: Booking | None, busy: set[str]) -> DeviceRow:
    return _row(
        gpu,
        uuid=gpu.uuid,
        label=f"{gpu.node.hostname}/gpu{gpu.index}",
        profile="MIG" if gpu.mig_mode else "",
        memory_mib=gpu.memory_mib,
        mig_id=None,
        reading=readings.get(gpu.uuid),
        booking=booking,
        busy=gpu.uuid in busy,
        topology=_topology_hint(gpu),
        shared=gpu.sharing == Gpu.Sharing.SHARED,
    )


def _topology_hint(gpu: Gpu) -> str:
    """Its NUMA node and NVLink peers, e.g. "NUMA 0 · NVLink to 1, 2, 3, 4" ("": none reported)."""
    parts = [] if gpu.numa_node is None else [f"NUMA {gpu.numa_node}"]
    if gpu.nvlink_peers:
        parts.append(f"NVLink to {', '.join(map(str, gpu.nvlink_peers))}")
    return " · ".join(parts)


def _mig_row(
    gpu: Gpu, mig: MigInstance, readings: dict, booking: Booking | None, busy: set[str]
) -> DeviceRow:
    return _row(
        gpu,
        uuid=mig.uuid,
        label=mig_label(
            hostname=gpu.node.hostname,
            gpu_index=gpu.index,
            profile=mig.profile,
            placement_start=mig.placement_start,
        ),
        profile=mig.profile,
        memory_mib=mig.memory_mib,
        mig_id=mig.pk,
        reading=readings.get(mig.uuid),
        booking=booking,
        busy=mig.uuid in busy,
    )


def _row(gpu: Gpu, *, mig_id: int | None, reading, booking, busy: bool, **fields) -> DeviceRow:
    return DeviceRow(
        node=gpu.node.hostname,
        node_state=gpu.node.state,
        gpu_id=gpu.pk,
        model=gpu.model,
        is_mig=mig_id is not None,
        mig_id=mig_id,
        state=device_state(
            node_state=gpu.node.state,
            booking=booking,
            reading=reading,
            busy=busy,
            retired=gpu.retired_at is not None,
        ),
        booking=booking,
        reading=reading,
        **fields,
    )


def _parent_state(row: DeviceRow) -> str:
    states = {c.state for c in row.children}
    if row.node_state != Node.State.UP:
        return "down"
    # The GPU's own state already says "unbooked" when processes run on it outside any slice.
    if "unbooked" in states or (
        row.state == "unbooked" and not any(c.booking for c in row.children)
    ):
        return "unbooked"
    if states == {"free"}:
        return "free"
    return "in_use" if "in_use" in states else ("partly booked" if "free" in states else "booked")


@dataclass(frozen=True)
class Totals:
    """The site at a glance."""

    free_gpus: int
    whole_gpus: int
    free_slices: int
    slices: int
    queued: int
    queued_gpu_hours: float
    booked_today_pct: float | None
    mean_utilization_now: float | None


def site_totals(*, rows: list[DeviceRow], now: datetime) -> Totals:
    """Free devices, queued demand and how much of today's capacity was booked."""
    whole = [r for r in rows if not r.children]
    slices = [c for r in rows for c in r.children]
    queued, queued_hours = queue_demand()
    measured = [
        r.reading["utilization_gpu"]
        for r in rows
        if r.reading and r.reading.get("utilization_gpu") is not None
    ]
    return Totals(
        free_gpus=sum(1 for r in whole if r.state == "free"),
        whole_gpus=len(whole),
        free_slices=sum(1 for c in slices if c.state == "free"),
        slices=len(slices),
        queued=queued,
        queued_gpu_hours=queued_hours,
        booked_today_pct=_booked_share_today(now=now, devices=len(rows)),
        mean_utilization_now=round(sum(measured) / len(measured), 1) if measured else None,
    )


def queue_demand() -> tuple[int, float]:
    """(pending bookings, their GPU-hours): a MIG request counts its slices' share of a GPU."""
    slices_of = dict(inventory.mig_instances_bookable().values_list("profile", "slices").distinct())
    groups = (
        Booking.objects.filter(state=Booking.State.PENDING)
        .values("gpus", "mig_profile")
        .annotate(n=Count("id"), seconds=Sum("duration_s"))
        .order_by()
    )
    count, hours = 0, 0.0
    for group in groups:
        width = group["gpus"] or slices_of.get(group["mig_profile"], 7) / 7
        count += group["n"]
        hours += width * group["seconds"] / 3600
    return count, round(hours, 1)


def _booked_share_today(*, now: datetime, devices: int) -> float | None:
    midnight = now.replace(hour=0, minute=0, second=0, microsecond=0)
    if devices == 0 or now <= midnight:
        return None
    # Ended allocations had their end cut to the real end, so every row counts as it stands.
    rows = Allocation.objects.filter(start__lt=now, end__gt=midnight).values_list(
        "start", "end", "fraction"
    )
    return booked_share(rows, since=midnight, until=now, capacity=devices)


def my_live_bookings(*, user, limit: int | None = None) -> list[Booking]:
    """The user's own pending, planned and active bookings (the first `limit`), soonest first."""
    return list(
        Booking.objects.filter(owner=user, state__in=Booking.LIVE_STATES)
        .defer("log_tail", "priority")
        .select_related("project")
        .prefetch_related(_allocations_prefetch())
        .order_by("state", "planned_start", "id")[:limit]
    )


def _allocations_prefetch() -> Prefetch:
    return Prefetch(
        "allocations", queryset=Allocation.objects.select_related("gpu__node", "mig_instance")
    )


def bookings_for_page(*, user, limit: int = 50) -> list[Booking]:
    """What /bookings/ lists: live bookings first, then the most recent others."""
    qs = (
        visible_bookings(user)
        .select_related("owner", "project")
        .prefetch_related(_allocations_prefetch())
    )
    live = list(qs.filter(state__in=Booking.LIVE_STATES).order_by("-submitted_at", "-id"))
    done = list(qs.exclude(state__in=Booking.LIVE_STATES).order_by("-submitted_at", "-id")[:limit])
    return live + done


def booking_for_page(*, user, booking_id: int) -> Booking | None:
    return (
        visible_bookings(user)
        .select_related("owner", "project")
        .prefetch_related(_allocations_prefetch())
        .filter(pk=booking_id)
        .first()
    )


def filter_choices() -> dict:
    return {
        "models": sorted(set(inventory.gpus_live().values_list("model", flat=True))),
        "nodes": list(Node.objects.order_by("hostname").values_list("hostname", flat=True)),
        "states": list(FILTER_STATES),
    }


# Pure helpers -------------------------------------------------------------------------------


def filter_rows(rows: list[DeviceRow], *, model="", node="", state="") -> list[DeviceRow]:
    """The rows matching the overview's filters (a GPU matches if one of its slices does)."""
    return [
        r
        for r in rows
        if (not model or r.model == model)
        and (not node or r.node == node)
        and (not state or r.state == state or any(c.state == state for c in r.children))
    ]


def usage_hints(booking: Booking) -> list[tuple[str, str]]:
    """(hostname, CUDA_VISIBLE_DEVICES value) per node a booking holds devices on."""
    by_node: dict[str, list[str]] = {}
    for allocation in booking.allocations.all():
        if allocation.live:
            by_node.setdefault(allocation.gpu.node.hostname, []).append(allocation.device_uuid)
    return [(host, ",".join(uuids)) for host, uuids in sorted(by_node.items())]


def booked_share(rows, *, since: datetime, until: datetime, capacity: int) -> float | None:
    """Percent of `capacity` devices' time in [since, until) covered by (start, end, fraction)."""
    span = (until - since).total_seconds()
    if capacity <= 0 or span <= 0:
        return None
    booked = sum(
        fraction * max(0.0, (min(end, until) - max(start, since)).total_seconds())
        for start, end, fraction in rows
    )
    return round(100 * booked / (capacity * span), 1)


def time_left(booking: Booking, now: datetime) -> timedelta | None:
    """How long an active booking still holds its devices."""
    ends = [a.end for a in booking.allocations.all() if a.live]
    if booking.state != Booking.State.ACTIVE or not ends:
        return None
    return max(timedelta(0), max(ends) - now)


def booking_length(booking: Booking) -> tuple[int, bool]:
    """(seconds, ran?) to show as a booking's length: how long it ran once it has ended after
    starting, else the length asked for (pending, planned, running, or ended before it started)."""
    if booking.started_at and booking.ended_at:
        return max(0, int((booking.ended_at - booking.started_at).total_seconds())), True
    return booking.duration_s, False


def pending_reason_text(code: str) -> str:
    return PENDING_REASONS.get(code, "")


@dataclass(frozen=True)
class ProcessLine:
    """A process on a device, now or in the rollups: who, what, how much memory, whose."""

    device: str
    pid: int
    user: str
    name: str
    memory_mib: int | None
    mark: str = ""  # "" (the booking's), "foreign" (the agent objected), "unbooked"
    first_seen: datetime | None = None
    last_seen: datetime | None = None
    booking_id: int | None = None


def processes_now(devices: dict[str, str], readings: dict, booked: set[str]) -> list[ProcessLine]:
    """The processes in the latest readings of `devices` (uuid -> label), nvitop-like."""
    objected = _objected(list(devices))
    lines = []
    for uuid, label in devices.items():
        for p in (readings.get(uuid) or {}).get("processes") or ():
            mark = "unbooked" if uuid not in booked else _mark(uuid, p.get("pid"), objected)
            lines.append(
                ProcessLine(
                    label,
                    p.get("pid"),
                    p.get("user") or "",
                    p.get("name") or "",
                    p.get("used_memory_mib"),
                    mark,
                    booking_id=p.get("booking_id"),
                )
            )
    return sorted(lines, key=lambda line: -(line.memory_mib or 0))


def processes_seen(
    *,
    devices: dict[str, str] | None = None,
    booking_id: int | None = None,
    since: datetime | None = None,
    limit: int = 50,
) -> list[ProcessLine]:
    """Process rollups of some devices (uuid -> label) or of one booking, newest first."""
    rows = ProcessUsage.objects.order_by("-last_seen", "-id")
    if devices is not None:
        rows = rows.filter(device_uuid__in=list(devices))
    if booking_id is not None:
        rows = rows.filter(booking_id=booking_id)
    if since is not None:
        rows = rows.filter(last_seen__gte=since)
    rows = list(rows[:limit])
    labels = devices or device_labels({r.device_uuid for r in rows})
    objected = _objected(list({r.device_uuid for r in rows}))
    return [
        ProcessLine(
            labels.get(r.device_uuid, r.device_uuid),
            r.pid,
            r.user,
            r.name,
            r.peak_memory_mib,
            "unbooked" if r.foreign else _mark(r.device_uuid, r.pid, objected),
            r.first_seen,
            r.last_seen,
            r.booking_id,
        )
        for r in rows
    ]


def _objected(uuids: list[str]) -> set[tuple[str, int]]:
    """(device, pid) of the processes the agents reported as someone else's."""
    alerts = NodeAlert.objects.filter(
        kind=NodeAlert.Kind.FOREIGN_PROCESS, device_uuid__in=uuids, pid__isnull=False
    )
    return set(alerts.values_list("device_uuid", "pid"))


def _mark(uuid: str, pid: int | None, objected: set[tuple[str, int]]) -> str:
    return "foreign" if (uuid, pid) in objected else ""


def device_labels(uuids: set[str]) -> dict[str, str]:
    labels = {
        g.uuid: f"{g.node.hostname}/gpu{g.index}"
        for g in Gpu.objects.filter(uuid__in=uuids).select_related("node")
    }
    for m in MigInstance.objects.filter(uuid__in=uuids).select_related("gpu__node"):
        labels[m.uuid] = str(m)
    return labels


def node_runs_current(*, booking) -> list:
    """Each node's process of the booking's current run, in rank order (docs/distributed.md)."""
    return list(
        NodeRun.objects.filter(booking=booking, restart=booking.restart_count)
        .select_related("node")
        .order_by("rank", "id")
    )
