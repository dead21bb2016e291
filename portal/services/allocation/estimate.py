"""When would a booking start? The allocator's answer for a request not yet submitted.

The answer is named as on a booking (planned_start, queue_position, pending_reason,
state_detail). A queued request is planned on a snapshot of the queue that is shared for
ESTIMATE_SNAPSHOT_TTL_S seconds: the Book page asks as the user types, and reading the whole
queue for each keystroke would cost more than the pass itself.
"""

import threading
import time
from dataclasses import dataclass
from datetime import datetime

from django.conf import settings

import scheduler
from portal.errors import ApplicationError
from portal.services.allocation.snapshot import (
    Snapshot,
    scheduler_policy,
    snapshot_plus,
    snapshot_take,
)
from portal.services.booking import bookings as booking_services
from portal.services.booking.booking_rules import BookingRequest, check_request
from portal.services.booking.containers import image_check
from portal.services.booking.dependencies import after_check, array_check, queued_only_check
from portal.services.booking.job_env import job_env_check, node_count_gpus
from portal.services.booking.sessions import session_request_check
from portal.services.core import counters
from portal.services.core.clock import from_epoch

ESTIMATE_ID = 0  # the hypothetical booking's id in the snapshot; real ids start at 1


@dataclass(frozen=True)
class Estimate:
    """The earliest start the allocator would give now, and why not sooner."""

    planned_start: datetime | None
    pending_reason: str
    state_detail: str
    queue_position: int | None = None


def booking_estimate(*, user, now: datetime, **fields) -> Estimate:
    """Validate like a submission (same refusals), then plan it without writing anything."""
    interactive = fields.pop("interactive", None)
    job = {name: fields.pop(name, None) for name in ("workdir", "env", "signal")}
    fields["gpus"] = node_count_gpus(
        node_count=fields.pop("node_count", None),
        gpus=fields.get("gpus"),
        gpu_model=fields.get("gpu_model"),
        mig_profile=fields.get("mig_profile"),
    )
    spec, after = array_check(fields.pop("array", None)), fields.pop("after", None)
    image = fields.pop("image", None)
    request = check_request(user=user, now=now, **_request_fields(fields))
    kind = session_request_check(interactive=interactive, command=request.command)
    job_env_check(command=request.command, **job)
    image = image_check(
        image=image,
        command=request.command,
        interactive=kind,
        gpu_model=request.gpu_model,
        mig_profile=request.mig_profile,
    )
    deps = after_check(user=user, after=after)
    queued_only_check(
        request, command=request.command, interactive=interactive, array=spec, after=deps
    )
    if deps.waiting:
        return Estimate(planned_start=None, pending_reason="dependency", state_detail=deps.waiting)
    if request.start is not None:
        return _estimate_reservation(user, request, now, image)
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


def _estimate_reservation(user, request: BookingRequest, now: datetime, image: str) -> Estimate:
    try:
        booking_services.check_reservation(user, request, now, image=image)
    except ApplicationError as exc:
        return Estimate(planned_start=None, pending_reason=exc.code, state_detail=exc.message)
    return Estimate(
        planned_start=request.start,
        pending_reason="fits",
        state_detail="The devices are free for the whole window.",
    )


def _estimate_queued(user, request: BookingRequest, now: datetime) -> Estimate:
    hypothetical = booking_services.booking_from_request(user, request, now)
    hypothetical.pk = ESTIMATE_ID
    state = snapshot_plus(estimate_snapshot(now=now), now=now, bookings=[hypothetical])
    plan = scheduler.plan(state, scheduler_policy())
    mine = next(p for p in plan.planned if p.booking_id == str(ESTIMATE_ID))
    start = from_epoch(mine.start) if mine.start is not None else None
    return Estimate(
        planned_start=start,
        pending_reason=mine.reason,
        state_detail=mine.detail,
        # One that starts at once never waits in the queue: it has no place in it.
        queue_position=None if mine.reason == "starting" else mine.position,
    )


_lock = threading.Lock()
_shared: tuple[float, Snapshot] | None = None


def estimate_snapshot(*, now: datetime) -> Snapshot:
    """The queue as the estimates of this process see it: taken at most ESTIMATE_SNAPSHOT_TTL_S
    seconds ago (0: each time). Requests that come while it is taken wait for it, not take
    their own."""
    global _shared
    ttl = settings.ESTIMATE_SNAPSHOT_TTL_S
    with _lock:
        if _shared is not None and time.monotonic() - _shared[0] < ttl:
            return _shared[1]
        snap = snapshot_take(now=now)
        _shared = (time.monotonic(), snap)
        counters.counter_add("estimate_snapshots")
        return snap


def estimate_snapshot_forget() -> None:
    """Drop this process's shared snapshot: the next estimate reads the queue afresh."""
    global _shared
    with _lock:
        _shared = None
