"""Reads of the fleet for the agents' endpoints, pages and the API: which node a token belongs to,
a node's desired state, a device's reading history (writes live in `agents`, `nodes`, `telemetry`)."""

import hashlib
import json
import math
from datetime import datetime, timedelta

from django.conf import settings
from django.utils import timezone

from agents import protocol
from agents.protocol import DesiredBooking, DesiredState
from portal.errors import ValidationFailed
from portal.models import Allocation, Booking, Node, Sample, SampleMinute
from portal.models.tokens import hash_token
from portal.services.fleet.telemetry import SAMPLE_VALUES, floor_minute


def node_for_token(raw: str) -> Node | None:
    """The node this agent token belongs to, or None."""
    if not raw:
        return None
    return Node.objects.filter(agent_token_hash=hash_token(raw)).first()


def agent_desired(*, node_id: int) -> DesiredState:
    """The active bookings holding the node's devices, with a generation that changes with them.

    The generation is a hash of the content, so it changes exactly when what the agent must do
    changes, needs no stored counter, and the push (desired_push) can quote the same number.
    """
    bookings = _desired_bookings(node_id)
    encoded = json.dumps([protocol.to_json(b) for b in bookings], sort_keys=True)
    generation = int(hashlib.sha256(encoded.encode()).hexdigest()[:13], 16)  # < 2**53: JSON-safe
    return DesiredState(generation=generation, bookings=bookings)


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
    return [
        DesiredBooking(
            booking_id=booking_id,
            owner=held[0].booking.owner.username,
            device_uuids=[a.device_uuid for a in held],
            start=min(a.start for a in held),
            end=max(a.end for a in held),
            command=held[0].booking.command or None,
            **_session_fields(held[0].booking),
        )
        for booking_id, held in grouped.items()
    ]


def _session_fields(booking: Booking) -> dict:
    if booking.interactive == Booking.Interactive.NONE:
        return {}
    return {"interactive": booking.interactive, "session_token": booking.session_token}


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
