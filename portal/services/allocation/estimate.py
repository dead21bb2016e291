"""When would a booking start? The allocator's answer for a request not yet submitted.

The answer is named as on a booking (planned_start, queue_position, pending_reason,
state_detail). A queued request is planned on a snapshot of the queue that is shared for
ESTIMATE_SNAPSHOT_TTL_S seconds: the Book page asks as the user types, and reading the whole
queue for each keystroke would cost more than the pass itself. The queue's walk is kept with
it (``scheduler.keep_walk``): a request resumes the walk from a copy of its state a few hundred
bookings before its own place, wherever it ranks, instead of walking the whole queue again.
"""

import os
import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from django.conf import settings
from django.core.cache import cache
from django.db import connection
from django.utils import timezone

import scheduler
from agents.protocol import image_runtimes
from portal.errors import ApplicationError, NoCapacity
from portal.services.allocation.snapshot import (
    Snapshot,
    snapshot_extra,
    snapshot_plus,
    snapshot_take,
)
from portal.services.booking import bookings as booking_services
from portal.services.booking.booking_rules import BookingRequest, check_request
from portal.services.booking.containers import image_check
from portal.services.booking.dependencies import after_check, array_check, queued_only_check
from portal.services.booking.job_env import job_env_check, node_count_gpus
from portal.services.booking.project_reservations import holds_against
from portal.services.booking.sessions import session_request_check
from portal.services.booking.sharing_rules import fraction_check_nodes
from portal.services.core import counters
from portal.services.core.clock import from_epoch, to_epoch
from portal.services.inventory import placement

ESTIMATE_ID = 0  # the hypothetical booking's id in the snapshot; real ids start at 1


@dataclass(frozen=True)
class Window:
    """A reservation's window."""

    start: datetime
    end: datetime


@dataclass(frozen=True)
class Estimate:
    """The earliest start the allocator would give now, and why not sooner; for a reservation
    window that does not fit, the next window of the same length that does (None: none)."""

    planned_start: datetime | None
    pending_reason: str
    state_detail: str
    queue_position: int | None = None
    next_window: Window | None = None


# How far after a refused window the next one that fits is looked for.
NEXT_WINDOW_SEARCH = timedelta(days=30)


def booking_estimate(*, user, now: datetime, **fields) -> Estimate:
    """Validate like a submission (same refusals), then plan it without writing anything."""
    interactive = fields.pop("interactive", None)
    job = {name: fields.pop(name, None) for name in ("workdir", "env", "signal")}
    node_count = fields.pop("node_count", None)
    fraction_check_nodes(
        node_count,
        gpu_fraction=fields.get("gpu_fraction"),
        gpu_memory_mib=fields.get("gpu_memory_mib"),
    )
    fields["gpus"] = node_count_gpus(
        node_count=node_count,
        gpus=fields.get("gpus"),
        gpu_model=fields.get("gpu_model"),
        mig_profile=fields.get("mig_profile"),
    )
    spec, after = array_check(fields.pop("array", None)), fields.pop("after", None)
    image = fields.pop("image", None)
    request = check_request(user=user, now=now, **_request_fields(fields))
    kind = session_request_check(interactive=interactive, command=request.command)
    job_env_check(command=request.command, duration_s=request.duration_s, **job)
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
        "mixed_models": False,
        "start": None,
        "end": None,
        "duration_s": None,
        "qos": "normal",
        "preemptible": False,
        "command": "",
        "gpu_fraction": None,
        "gpu_memory_mib": None,
    }
    return {**defaults, **fields}


def _estimate_reservation(user, request: BookingRequest, now: datetime, image: str) -> Estimate:
    try:
        booking_services.check_reservation(user, request, now, image=image)
    except NoCapacity as exc:
        window = _next_window(user, request, now, image)
        return Estimate(None, exc.code, exc.message, next_window=window)
    except ApplicationError as exc:
        return Estimate(planned_start=None, pending_reason=exc.code, state_detail=exc.message)
    return Estimate(
        planned_start=request.start,
        pending_reason="fits",
        state_detail="The devices are free for the whole window.",
    )


def _next_window(user, request: BookingRequest, now: datetime, image: str):
    """The next window as long as the reservation's, starting within NEXT_WINDOW_SEARCH after
    its own: the earliest with devices free by the placement rules, if the quota rule allows
    it there too (check_reservation); None otherwise. Reads only."""
    start = placement.next_window_start(
        start=request.start,
        end=request.end,
        until=request.start + NEXT_WINDOW_SEARCH,
        gpus=request.gpus,
        mig_profile=request.mig_profile,
        gpu_model=request.gpu_model,
        mixed_models=request.mixed_models,
        allowed_models=request.quota.allowed_models,
        runtimes=image_runtimes(image) if image else (),
        gpu_fraction=request.gpu_fraction,
        gpu_memory_mib=request.gpu_memory_mib,
        cpus=request.cpus,
        memory_mib=request.memory_mib,
        project_holds=holds_against(
            project=request.project.slug,
            start=request.start,
            end=request.start + NEXT_WINDOW_SEARCH + (request.end - request.start),
        ),
    )
    if start is None:
        return None
    window = Window(start, start + (request.end - request.start))
    try:
        booking_services.check_reservation(
            user, replace(request, start=window.start, end=window.end), now, image=image
        )
    except ApplicationError:  # a quota the window breaks (or devices taken a moment ago)
        return None
    return window


def _estimate_queued(user, request: BookingRequest, now: datetime) -> Estimate:
    hypothetical = booking_services.booking_from_request(user, request, now)
    hypothetical.pk = ESTIMATE_ID
    queue = estimate_queue(now=now)
    with _answering():
        mine = _line(queue, now, hypothetical)
    # The queue is planned at its snapshot's time, seconds ago: a start not before now.
    start = from_epoch(max(mine.start, to_epoch(now))) if mine.start is not None else None
    return Estimate(
        planned_start=start,
        pending_reason=mine.reason,
        state_detail=mine.detail,
        # One that starts at once never waits in the queue: it has no place in it.
        queue_position=None if mine.reason == "starting" else mine.position,
    )


def _line(queue: "_Queue", now: datetime, hypothetical) -> scheduler.Planned:
    """The hypothetical booking's line in the plan of the queue with it."""
    snap, kept = queue.snap, queue.kept
    if kept is not None:
        requests, users, projects, shares = snapshot_extra(snap, now=now, bookings=[hypothetical])
        line = kept.line(
            requests[0], user_quotas=users, project_quotas=projects, project_shares=shares
        )
        if line is not None:
            return line
    state = snapshot_plus(snap, now=now, bookings=[hypothetical])
    # The walk stops at the hypothetical booking: what comes after it in priority order
    # cannot change its line.
    return scheduler.plan(state, snap.policy, until=str(ESTIMATE_ID)).planned[-1]


@dataclass
class _Queue:
    """The queue the estimates of this process plan on: a snapshot, when it was ready
    (``time.monotonic()``, once read and walked), and its walk kept between estimates (None with
    a TTL of 0)."""

    ready: float
    snap: Snapshot
    kept: scheduler.KeptWalk | None = None


REFRESH_SWITCH_INTERVAL_S = 0.0005
# Past its TTL a queue still answers while the next one is walked, for at most this long: an
# idle process's queue from long ago is read again before answering.
STALE_GRACE_S = 30.0
WALK_LOCK_KEY = "estimate:walking"  # held by the process reading and walking its next queue
WALK_LOCK_S = 60  # a process that died walking holds it no longer than this
PAUSE_LIMIT_S = 0.2  # the longest the background walk waits for requests at one pause
_lock_in_flight = threading.Lock()
_lock = threading.Lock()
_shared: _Queue | None = None
_refreshing = threading.Event()  # the next queue is being read and walked in the background


def estimate_queue(*, now: datetime) -> _Queue:
    """The queue as the estimates of this process see it, with its walk kept (0: read for each
    estimate, not walked ahead).

    A queue serves for ESTIMATE_SNAPSHOT_TTL_S seconds once ready. Past that the next one is
    read and walked in the background while this one still answers (for STALE_GRACE_S more at
    most), so no estimate waits for a walk of the whole queue; only the first of a process does,
    one after an idle spell, and every one inside a transaction (a test's: a read on another
    connection would not see its writes).
    """
    global _shared
    ttl = settings.ESTIMATE_SNAPSHOT_TTL_S
    with _lock:
        queue = _shared
        if queue is not None and time.monotonic() - queue.ready < ttl:
            return queue
        if _may_answer_stale(queue, ttl):
            # One process of the site walks at a time: walks side by side would share the cores
            # with every request. The others answer from their last queue and try again later.
            if not _refreshing.is_set() and cache.add(WALK_LOCK_KEY, 1, timeout=WALK_LOCK_S):
                _refreshing.set()
                threading.Thread(target=_refresh, name="estimate-queue", daemon=True).start()
            return queue
        _shared = _take(now, walk=ttl > 0)
        return _shared


def _may_answer_stale(queue: _Queue | None, ttl: float) -> bool:
    # Not from inside a transaction (a test's): a read on another connection would not see what
    # the transaction wrote. Not a queue left from long ago either (a process that was idle).
    if queue is None or ttl <= 0 or connection.in_atomic_block:
        return False
    return time.monotonic() - queue.ready < ttl + STALE_GRACE_S


def _take(now: datetime, *, walk: bool, pause=None) -> _Queue:
    snap = snapshot_take(now=now)
    counters.counter_add("estimate_snapshots")
    # With project holds the kept walk answers nothing (scheduler.kept_walk): not walked.
    walk = walk and not snap.state.holds
    kept = scheduler.keep_walk(snap.state, snap.policy, pause=pause) if walk else None
    return _Queue(time.monotonic(), snap, kept)


_in_flight = 0  # estimates of this process placing their request now
_quiet = threading.Event()  # set while none is
_quiet.set()


@contextmanager
def _answering():
    global _in_flight
    with _lock_in_flight:
        _in_flight += 1
        _quiet.clear()
    try:
        yield
    finally:
        with _lock_in_flight:
            _in_flight -= 1
            if not _in_flight:
                _quiet.set()


def _let_requests_go() -> None:
    # The background walk waits between bookings while a request of its process places its
    # own: they share one interpreter lock. A bounded wait: a stream of requests only slows it.
    _quiet.wait(PAUSE_LIMIT_S)


def _refresh() -> None:
    global _shared
    # While this thread walks, a request thread of this process that comes back from the
    # database waits for the interpreter lock up to the switch interval (5 ms), once per
    # query: hand it over sooner.
    interval = sys.getswitchinterval()
    sys.setswitchinterval(min(interval, REFRESH_SWITCH_INTERVAL_S))
    try:
        # Behind the requests of every process: this is work ahead of need.
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 10)
        queue = _take(timezone.now(), walk=True, pause=_let_requests_go)
        with _lock:
            _shared = queue
    finally:
        sys.setswitchinterval(interval)
        cache.delete(WALK_LOCK_KEY)
        connection.close()
        _refreshing.clear()


def estimate_snapshot_forget() -> None:
    """Drop this process's shared queue: the next estimate reads the queue afresh."""
    global _shared
    with _lock:
        _shared = None
