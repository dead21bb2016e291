"""Reads of the fleet for the agents' endpoints, pages and the API: which node a token belongs to,
a node's desired state, a device's reading history (writes live in `agents`, `nodes`, `telemetry`)."""

import hashlib
import json
import math
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db.models import Count, F
from django.utils import timezone

from agents import protocol
from agents.protocol import DesiredBooking, DesiredState, EnvVar, NodePlace
from portal.errors import ValidationFailed
from portal.job_env import signal_parse
from portal.models import Allocation, Booking, Node, Sample, SampleMinute
from portal.models.tokens import hash_token
from portal.services.fleet.mig_layouts import mig_layouts_desired
from portal.services.fleet.telemetry import SAMPLE_VALUES, floor_minute
from portal.services.inventory.resources import live_holdings


def node_for_token(raw: str) -> Node | None:
    """The node this agent token belongs to, or None."""
    if not raw:
        return None
    # With its last heartbeat (kept apart from the node row), which node_mark_seen reads.
    nodes = Node.objects.annotate(last_seen=F("heartbeat__last_seen"))
    return nodes.filter(agent_token_hash=hash_token(raw)).first()


def agent_desired(*, node_id: int) -> DesiredState:
    """The active bookings holding the node's devices, with a generation that changes with them.

    The generation is a hash of the content, so it changes exactly when what the agent must do
    changes, needs no stored counter, and the push (desired_push) can quote the same number.
    """
    bookings = _desired_bookings(node_id)
    layouts = mig_layouts_desired(node_id=node_id)
    content = [protocol.to_json(b) for b in bookings]
    if layouts:  # without any, the generation stays what it was before MIG layouts changed
        content.append([protocol.to_json(layout) for layout in layouts])
    encoded = json.dumps(content, sort_keys=True)
    generation = int(hashlib.sha256(encoded.encode()).hexdigest()[:13], 16)  # < 2**53: JSON-safe
    return DesiredState(generation=generation, bookings=bookings, mig_layouts=layouts)


def _desired_bookings(node_id: int) -> list[DesiredBooking]:
    allocations = (
        Allocation.objects.filter(
            live=True, gpu__node_id=node_id, booking__state=Booking.State.ACTIVE
        )
        .select_related("booking__owner", "gpu", "mig_instance")
        .order_by("booking_id", "id")
    )
    grouped: dict[int, list[Allocation]] = {}
    for allocation in allocations:
        grouped.setdefault(allocation.booking_id, []).append(allocation)
    places = booking_node_places(booking_ids=list(grouped))
    # Cores and memory each holds here (node_demand: asked, else the default): the agent
    # confines the job to them; none on a node that reports no cores.
    holdings = live_holdings([node_id])
    return [
        DesiredBooking(
            booking_id=booking_id,
            owner=held[0].booking.owner.username,
            device_uuids=[a.device_uuid for a in held],
            start=min(a.start for a in held),
            end=max(a.end for a in held),
            command=held[0].booking.command or None,
            **_session_fields(held[0].booking),
            **_job_fields(held[0].booking, places[booking_id], node_id),
            array_job_id=held[0].booking.array_parent_id,
            array_task_id=held[0].booking.array_task_id,
            image=held[0].booking.image or None,
            **_share_fields(held[0]),
            **_host_fields(holdings.get((booking_id, node_id))),
        )
        for booking_id, held in grouped.items()
    ]


def _host_fields(held: tuple[int, int] | None) -> dict:
    if held is None:
        return {}
    return {"cpus": held[0], "memory_mib": held[1]}


def _share_fields(allocation: Allocation) -> dict:
    """What a fraction of a shared GPU holds on it (a fractional booking has one device)."""
    if allocation.share >= 1:
        return {}
    return {"gpu_fraction": allocation.share, "gpu_memory_mib": allocation.gpu_memory_mib}


def _session_fields(booking: Booking) -> dict:
    if booking.interactive == Booking.Interactive.NONE:
        return {}
    return {"interactive": booking.interactive, "session_token": booking.session_token}


@dataclass(frozen=True)
class BookingNode:
    """One node of a running booking: its rank (nodes in hostname order) and its place."""

    node_id: int
    rank: int
    place: NodePlace


def booking_node_places(*, booking_ids: list[int]) -> dict[int, list[BookingNode]]:
    """The nodes each booking holds live devices on, in rank order (by hostname).

    The one rank rule: desired state, rendezvous ports and per-node exits all ask here.
    """
    rows = (
        Allocation.objects.filter(booking_id__in=booking_ids, live=True)
        .values("booking_id", "gpu__node_id", "gpu__node__hostname", "gpu__node__address")
        .annotate(slots=Count("id"))
        .order_by("booking_id", "gpu__node__hostname")
    )
    found: dict[int, list[BookingNode]] = {booking_id: [] for booking_id in booking_ids}
    for row in rows:
        nodes = found[row["booking_id"]]
        hostname = row["gpu__node__hostname"]
        place = NodePlace(hostname, row["gpu__node__address"] or hostname, row["slots"])
        nodes.append(BookingNode(row["gpu__node_id"], len(nodes), place))
    return found


def _job_fields(booking: Booking, nodes: list[BookingNode], node_id: int) -> dict:
    if not booking.command:
        return {}
    signal_name, before = booking.signal_name, booking.signal_before_s
    if not signal_name and settings.JOB_SIGNAL_DEFAULT:
        signal_name, before = signal_parse(settings.JOB_SIGNAL_DEFAULT)
    return {
        "workdir": booking.workdir or None,
        "env": [EnvVar(name, value) for name, value in sorted(booking.env.items())],
        "nodes": [node.place for node in nodes],
        "node_rank": next(node.rank for node in nodes if node.node_id == node_id),
        # One node picks a free port itself; several meet on the one the portal handed out.
        "master_port": booking.master_port if len(nodes) > 1 else None,
        "warn_signal": signal_name or None,
        "warn_before_s": before or 0,
        "kill_wait_s": settings.JOB_KILL_WAIT_S,
        "restart_count": booking.restart_count,
    }


def history_resolution(*, since: datetime, resolution: str = "auto") -> str:
    """ "raw" or "minute" for a history from `since`; raw before raw retention is an error."""
    hours = settings.TELEMETRY_RAW_RETENTION_H
    within_raw = since >= timezone.now() - timedelta(hours=hours)
    if resolution == "auto":
        return "raw" if within_raw else "minute"
    if resolution == "raw" and not within_raw:
        raise ValidationFailed.field(
            "from",
            f"raw samples are kept for {hours:g} h; ask for resolution=minute or a later `from`",
        )
    return resolution


def samples_history(
    *,
    uuid: str,
    since: datetime,
    until: datetime,
    max_points: int = 1500,
    resolution: str = "auto",
) -> list[dict]:
    """A device's readings over [since, until), oldest first, at most `max_points` of them.

    Raw samples when the range lies within raw retention, per-minute averages otherwise;
    downsampled by averaging runs of consecutive points. Keys: time, utilization_gpu,
    utilization_memory, memory_used_mib, memory_total_mib, temperature_c, power_w; a value not
    measured (MIG utilization) stays None.
    """
    if history_resolution(since=since, resolution=resolution) == "raw":
        points = list(
            Sample.objects.filter(uuid=uuid, time__gte=since, time__lt=until)
            .order_by("time", "id")
            .values("time", *SAMPLE_VALUES)
        )
    else:
        points = [
            _minute_point(row)
            for row in SampleMinute.objects.filter(
                uuid=uuid, minute__gte=floor_minute(since), minute__lt=until
            )
            .order_by("minute")
            .values()
        ]
    return _downsample(points, max(1, max_points))


def _minute_point(row: dict) -> dict:
    return {
        "time": row["minute"],
        "utilization_gpu": row["utilization_gpu_avg"],
        "utilization_memory": row["utilization_memory_avg"],
        "memory_used_mib": row["memory_used_mib_avg"],
        "memory_total_mib": row["memory_total_mib"],
        "temperature_c": row["temperature_c_avg"],
        "power_w": row["power_w_avg"],
    }


def _downsample(points: list[dict], max_points: int) -> list[dict]:
    if len(points) <= max_points:
        return points
    size = math.ceil(len(points) / max_points)
    return [_average(points[i : i + size]) for i in range(0, len(points), size)]


def _average(run: list[dict]) -> dict:
    point = {"time": run[0]["time"]}
    for name in SAMPLE_VALUES:
        values = [p[name] for p in run if p[name] is not None]
        point[name] = sum(values) / len(values) if values else None
    return point
