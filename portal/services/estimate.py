"""When would a booking start? The allocator's answer for a request not yet submitted."""

from dataclasses import dataclass
from datetime import UTC, datetime

import scheduler
from portal.errors import ApplicationError
from portal.models import Booking
from portal.services import bookings as booking_services
from portal.services.booking_rules import BookingRequest, check_request
from portal.services.sessions import session_request_check
from portal.services.snapshot import scheduler_policy, snapshot_state

ESTIMATE_ID = 0  # the hypothetical booking's id in the snapshot; real ids start at 1


@dataclass(frozen=True)
class Estimate:
    """The earliest start the allocator would give now, and why not sooner."""

    earliest_start: datetime | None
    reason: str
    detail: str
    queue_position: int | None = None


def booking_estimate(*, user, now: datetime, **fields) -> Estimate:
    """Validate like a submission (same 400s), then plan it without writing anything."""
    interactive = fields.pop("interactive", None)
    request = check_request(user=user, now=now, **_request_fields(fields))
    session_request_check(interactive=interactive, command=request.command)
    if request.start is not None:
        return _estimate_reservation(user, request, now)
    return _estimate_queued(user, request, now)


def _request_fields(fields: dict) -> dict:
    defaults = {
        "project": None,
        "gpus": None,
        "mig_profile": None,
        "gpu_model": None,
        "start": None,
        "end": None,
        "duration_s": None,
        "qos": "normal",
        "preemptible": False,
        "command": "",
    }
    return {**defaults, **fields}


def _estimate_reservation(user, request: BookingRequest, now: datetime) -> Estimate:
    try:
        booking_services.check_reservation(user, request, now)
    except ApplicationError as exc:
        return Estimate(earliest_start=None, reason=exc.code, detail=exc.message)
    return Estimate(
        earliest_start=request.start,
        reason="fits",
        detail="The devices are free for the whole window.",
    )


def _estimate_queued(user, request: BookingRequest, now: datetime) -> Estimate:
    hypothetical = booking_services.booking_from_request(user, request, now)
    hypothetical.pk = ESTIMATE_ID
    pending = list(
        Booking.objects.filter(state=Booking.State.PENDING)
        .select_related("owner", "project")
        .order_by("submitted_at", "id")
    )
    state, _ = snapshot_state(now, pending + [hypothetical])
    plan = scheduler.plan(state, scheduler_policy())
    mine = next(p for p in plan.planned if p.booking_id == str(ESTIMATE_ID))
    start = datetime.fromtimestamp(mine.start, tz=UTC) if mine.start is not None else None
    return Estimate(
        earliest_start=start, reason=mine.reason, detail=mine.detail, queue_position=mine.position
    )
