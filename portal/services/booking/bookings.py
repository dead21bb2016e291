"""Booking commands: submit, cancel, release, extend. The path that must never be wrong.

Each command is one durable transaction: validate, lock the contended node rows once (sorted),
re-read availability under the lock, write, and leave side effects (allocation pass, agent
dispatch, notifications, live updates) to on_commit. PostgreSQL's exclusion constraint on
allocations is the backstop: if two writers still collide, the loser's IntegrityError becomes 409.
"""

from datetime import datetime, timedelta

from django.conf import settings
from django.db import IntegrityError, OperationalError, transaction
from django.db.models import F, Max, Min
from django.db.models.functions import Least

import scheduler
from agents.protocol import image_runtimes
from portal.errors import (
    InvalidState,
    NoCapacity,
    QuotaExceeded,
    ValidationFailed,
)
from portal.models import Allocation, Booking, BookingDependency, Node
from portal.services.access.audit import SYSTEM, Source, audit_booking, booking_state
from portal.services.booking import events, fairshare
from portal.services.booking.booking_bounds import request_bounds
from portal.services.booking.booking_rules import BookingRequest, check_request
from portal.services.booking.containers import image_check
from portal.services.booking.dependencies import (
    after_check,
    array_check,
    array_save,
    queued_only_check,
)
from portal.services.booking.job_env import job_env_apply, job_env_check, node_count_gpus
from portal.services.booking.project_reservations import holds_against
from portal.services.booking.quotas import quota_position
from portal.services.booking.selectors import booking_get_for_change
from portal.services.booking.sessions import session_prepare, session_request_check
from portal.services.booking.sharing_rules import fraction_check_nodes
from portal.services.booking.transitions import booking_cas
from portal.services.core.locking import (
    is_allocation_clash,
    lock_nodes,
    lock_quota_subjects,
    share_lock_nodes,
)
from portal.services.core.policy import scheduler_policy
from portal.services.inventory import placement
from portal.services.inventory import selectors as inventory
from portal.services.inventory.resources import (
    host_demand,
    node_capacities,
    resources_fit,
)
from portal.services.inventory.sharing import share_fits
from portal.services.inventory.windows import window_in_the_way
from scheduler.reserve import Slot

State = Booking.State


def booking_submit(
    *,
    user,
    now: datetime,
    project: str | None = None,
    gpus: int | None = None,
    mig_profile: str | None = None,
    gpu_model: str | None = None,
    mixed_models: bool = False,
    start: datetime | None = None,
    end: datetime | None = None,
    duration_s: int | None = None,
    qos: str = "normal",
    preemptible: bool = False,
    command: str = "",
    source: Source = SYSTEM,
    idempotency_key: str = "",
    request_digest: str = "",
    interactive: str | None = None,
    workdir: str | None = None,
    env: dict | None = None,
    signal: str | None = None,
    node_count: int | None = None,
    array: str | None = None,
    after: str | list[str] | None = None,
    image: str | None = None,
    gpu_fraction: float | None = None,
    gpu_memory_mib: int | None = None,
    cpus: int | None = None,
    memory_mib: int | str | None = None,
) -> Booking:
    """Submit a booking: a reservation is placed now or refused (409); an ASAP one is queued.

    With an idempotency key (see booking/idempotency.py) the booking row claims it: a second
    booking with the key fails on the owner+key unique constraint (IntegrityError).
    `interactive` ("jupyterlab", "terminal") asks for a session the node runs while it is active;
    `workdir`, `env` and `signal` ("USR1@120") are a batch job's environment (booking.job_env);
    `node_count` asks for that many whole nodes (booking.job_env.node_count_gpus).
    `array` ("0-99%10") queues one booking per task and returns the first; `after`
    ("afterok:41") holds each until its dependencies are met (booking/dependencies.py);
    `image` runs the command in that container image (booking/containers.py).
    `gpu_fraction` / `gpu_memory_mib` ask for a fraction of one shared GPU
    (booking/sharing_rules.py). `cpus` and `memory_mib` (MiB or "64G") are the cores and host
    memory per node (None: the site's default, docs/scheduling.md "Cores and memory").
    """
    fraction_check_nodes(node_count, gpu_fraction=gpu_fraction, gpu_memory_mib=gpu_memory_mib)
    gpus = node_count_gpus(
        node_count=node_count, gpus=gpus, gpu_model=gpu_model, mig_profile=mig_profile
    )
    interactive = session_request_check(interactive=interactive, command=command)
    spec, deps = array_check(array), after_check(user=user, after=after)
    request = check_request(
        user=user,
        now=now,
        project=project,
        gpus=gpus,
        mig_profile=mig_profile,
        gpu_model=gpu_model,
        mixed_models=mixed_models,
        start=start,
        end=end,
        duration_s=duration_s,
        qos=qos,
        preemptible=preemptible,
        command=command,
        gpu_fraction=gpu_fraction,
        gpu_memory_mib=gpu_memory_mib,
        cpus=cpus,
        memory_mib=memory_mib,
    )
    job = job_env_check(
        command=command, workdir=workdir, env=env, signal=signal, duration_s=request.duration_s
    )
    queued_only_check(request, command=command, interactive=interactive, array=spec, after=deps)
    image = image_check(
        image=image,
        command=request.command,
        interactive=interactive,
        gpu_model=request.gpu_model,
        mig_profile=request.mig_profile,
    )
    state = State.PENDING if request.start is None else State.PLANNED
    booking = booking_from_request(user, request, now, state)
    booking.image = image
    session_prepare(booking, interactive=interactive)
    job_env_apply(booking, job)
    booking.planned_start = request.start
    booking.idempotency_key, booking.request_digest = idempotency_key, request_digest
    # Validated before the transaction: the model's checks read nothing the booking locks protect,
    # and each is a round trip that would otherwise be made while the candidate nodes are locked.
    # The key's uniqueness is the database's to check, in the transaction that claims it. Owner
    # and project were just read, and check_request has checked every rule the model's check
    # constraints pin (window order, positive duration, GPUs or a MIG profile): asking the
    # database again is a round trip each (seven per submission), and it enforces them at the
    # insert anyway.
    booking.full_clean(exclude=["idempotency_key", "owner", "project"], validate_constraints=False)
    if request.start is not None:
        return _reserve(booking, request, now, source=source)
    with transaction.atomic(durable=True):
        if spec is None:
            booking.save()
            BookingDependency.objects.bulk_create(deps.rows(booking))
        else:
            array_save(booking, array.strip(), spec.task_ids, deps)
        _submitted(booking, source)
    return booking


def _submitted(booking: Booking, source: Source) -> None:
    # The audit row and the one fact (whose subscribers notify and push after commit).
    audit_booking(action="booking.submit", booking=booking, actor=booking.owner, source=source)
    events.booking_changed(booking, "submitted", cause="owner")


def booking_from_request(
    user, request: BookingRequest, now: datetime, state: str = State.PENDING
) -> Booking:
    """An unsaved Booking for a validated request (saved by submit, planned as-is by estimate)."""
    return Booking(
        owner=user,
        project=request.project,
        gpus=request.gpus,
        mig_profile=request.mig_profile,
        gpu_model=request.gpu_model,
        mixed_models=request.mixed_models,
        gpu_fraction=request.gpu_fraction,
        gpu_memory_mib=request.gpu_memory_mib,
        cpus=request.cpus,
        memory_mib=request.memory_mib,
        start=request.start,
        end=request.end,
        duration_s=request.duration_s,
        qos=request.qos,
        preemptible=request.preemptible,
        command=request.command,
        state=state,
        submitted_at=now,
    )


# Placements retried when another booking took a chosen device between placing and writing.
RESERVE_ATTEMPTS = 3


class _PlaceAgain(Exception):
    """The placement went stale under the transaction (a device taken, a node gone): roll back
    and place again."""


def _reserve(booking: Booking, request: BookingRequest, now: datetime, *, source) -> Booking:
    """Place a validated, unsaved reservation and save it with its allocations.

    Placing reads and locks nothing. The transaction then holds only the quota subjects
    (advisory locks), re-reads the use under them, share-locks the chosen nodes (up, and kept
    so), checks the devices are still bookable and inserts: the exclusion constraint decides
    between two bookings that chose the same device, and the loser places again, at most
    RESERVE_ATTEMPTS times. In the transaction: the booking, its allocations, its audit row and
    its fact; everything else runs after commit.
    """
    for _ in range(RESERVE_ATTEMPTS):
        try:
            devices, refusal = _place(request, booking.image), None
        except NoCapacity as exc:
            devices, refusal = [], exc
        try:
            with transaction.atomic(durable=True):
                lock_quota_subjects(project_id=request.project.pk, user_id=booking.owner_id)
                _check_window_quota(booking.owner, request, now, devices)
                if refusal is not None:
                    raise refusal  # after the quota: a quota refusal says more
                _hold_nodes(devices, request)
                booking.save()
                if not allocations_write(
                    booking=booking, devices=devices, start=request.start, end=request.end
                ):
                    raise _PlaceAgain
                _submitted(booking, source)
            return booking
        except _PlaceAgain:
            booking.pk, booking._state.adding = None, True  # its row was rolled back
    raise NoCapacity("Other bookings took these devices a moment ago; try again.")


def _hold_nodes(devices: list[Slot], request: BookingRequest) -> None:
    """Share-lock the chosen devices' nodes and check, under that lock, that the nodes are up
    and the devices still bookable (not retired since they were placed). A fraction of a shared
    GPU, or devices on nodes whose cores and memory are booked, lock their nodes outright (the
    constraint adds neither shares nor cores up: two reservations must not both see the room)
    and check the room under the lock."""
    nodes = {d.node for d in devices}
    shared = any(d.shared for d in devices)
    if shared or node_capacities(nodes):
        locked = set(lock_nodes(nodes))
        up = Node.objects.filter(pk__in=nodes, state=Node.State.UP).count()
        if locked != nodes or up != len(nodes) or not _room_fits(devices, request):
            raise _PlaceAgain
        if shared:
            return
    elif share_lock_nodes(nodes) != nodes:
        raise _PlaceAgain
    whole = [d.gpu for d in devices if d.mig is None]
    migs = [d.mig for d in devices if d.mig is not None]
    if whole and inventory.gpus_bookable().filter(pk__in=whole).count() != len(whole):
        raise _PlaceAgain
    if migs and inventory.mig_instances_bookable().filter(pk__in=migs).count() != len(migs):
        raise _PlaceAgain


def _room_fits(devices: list[Slot], request: BookingRequest) -> bool:
    """Under the node locks: each fraction still has room on its shared GPU, and the cores and
    memory the reservation holds still fit beside the others' on its nodes."""
    start, end = request.start, request.end
    if not all(
        share_fits(gpu_id=d.gpu, share=d.fraction, memory_mib=d.held_mib, start=start, end=end)
        for d in devices
        if d.shared
    ):
        return False
    return resources_fit(
        booking_id=0,
        asked=(request.cpus, request.memory_mib),
        devices=[(d.node, d.fraction) for d in devices],
        during=(start, end),
        policy=scheduler_policy(),
    )


def allocations_write(
    *, booking: Booking, devices: list[Slot], start: datetime, end: datetime
) -> bool:
    """Give `booking` these devices over [start, end) in a savepoint; False if the database
    refused because another booking holds one of them (the constraint or a deadlock)."""
    try:
        with transaction.atomic():
            Allocation.objects.bulk_create(
                Allocation(
                    booking=booking,
                    gpu_id=d.gpu,
                    mig_instance_id=d.mig,
                    start=start,
                    end=end,
                    fraction=d.fraction,
                    share=d.fraction if d.held_mib is not None else 1.0,
                    gpu_memory_mib=d.held_mib,
                )
                for d in devices
            )
    except (IntegrityError, OperationalError) as exc:
        if not is_allocation_clash(exc):
            raise
        return False
    return True


def check_reservation(
    user, request: BookingRequest, now: datetime, *, image: str = ""
) -> list[Slot]:
    """The devices a reservation would get now, or the refusal (quota, no capacity). Reads only."""
    _check_window_quota(user, request, now)
    devices = _place(request, image)
    _check_window_quota(user, request, now, devices)
    return devices


def _check_window_quota(
    user, request: BookingRequest, now: datetime, devices: list[Slot] | None = None
) -> None:
    """The one quota rule over the reservation's window, for the user in the project and for
    the project: most held at once there, GPU-hours used in the period plus the booking's;
    with ``devices`` (its placement), the cores and memory it would hold on their nodes too."""
    position = quota_position(
        project=request.project, user=user, now=now, window=(request.start, request.end)
    )
    hours = request.gpu_equivalents * request.duration_s / 3600
    host = None
    if devices:
        host = host_demand(
            asked=(request.cpus, request.memory_mib),
            devices=[(d.node, d.fraction) for d in devices],
        )
    refusal = scheduler.position_refusal(
        position.sides, gpus=request.gpu_equivalents, gpu_hours=hours, host=host
    )
    if refusal is not None:
        field = "gpus" if request.gpus else "mig_profile"
        raise _quota_exceeded(refusal, concurrent=field, budget="end", where="in that window")


def _quota_exceeded(
    refusal: scheduler.QuotaRefusal, *, concurrent: str, budget: str, where: str
) -> QuotaExceeded:
    """409 `quota` for a refusal that counts use: the limit, its value, the use, the ask, and
    the field at fault (`concurrent` for max_gpus, `budget` for gpu_hours_budget)."""
    who = "your project holds" if refusal.scope == "project" else "you hold"
    extra = {
        "limit": refusal.limit,
        "limit_value": refusal.limit_value,
        "usage": round(refusal.usage, 4),
        "asks": round(refusal.asks, 4),
    }
    if refusal.limit in ("max_cpus", "max_memory_mib"):
        unit = "cores" if refusal.limit == "max_cpus" else "MiB of host memory"
        field = "cpus" if refusal.limit == "max_cpus" else "memory_mib"
        reason = (
            f"{who} up to {refusal.usage:g} of {refusal.limit_value:g} {unit} {where}; "
            f"this asks {refusal.asks:g} more."
        )
        if concurrent == "by_s":
            field = "by_s"
        return QuotaExceeded(
            f"Quota {refusal.limit}: {reason}", fields={field: reason}, extra=extra
        )
    if refusal.limit == "max_gpus":
        reason = (
            f"{who} up to {round(refusal.usage, 2):g} of {refusal.limit_value:g} GPUs {where}; "
            f"this asks {round(refusal.asks, 2):g} more."
        )
        return QuotaExceeded(f"Quota max_gpus: {reason}", fields={concurrent: reason}, extra=extra)
    whose = "your project's" if refusal.scope == "project" else "your"
    reason = (
        f"{refusal.usage:.1f} of {whose} {refusal.limit_value:g} GPU-hours used; "
        f"this needs {refusal.asks:.1f} more."
    )
    return QuotaExceeded(f"Quota gpu_hours_budget: {reason}", fields={budget: reason}, extra=extra)


def _place(request: BookingRequest, image: str) -> list[Slot]:
    devices, free, short = placement.devices_for_window(
        runtimes=image_runtimes(image) if image else (),
        start=request.start,
        end=request.end,
        gpus=request.gpus,
        mig_profile=request.mig_profile,
        gpu_model=request.gpu_model,
        mixed_models=request.mixed_models,
        allowed_models=request.quota.allowed_models,
        gpu_fraction=request.gpu_fraction,
        gpu_memory_mib=request.gpu_memory_mib,
        cpus=request.cpus,
        memory_mib=request.memory_mib,
        project_holds=holds_against(
            project=request.project.slug, start=request.start, end=request.end
        ),
    )
    if not devices and short is not None:
        what = "cores" if short == "cpus" else "host memory"
        raise NoCapacity(
            f"The GPUs are free for the whole window {request.start:%Y-%m-%d %H:%M} to "
            f"{request.end:%Y-%m-%d %H:%M} UTC, but not the {what} this booking asks on their "
            "nodes; ask for less, pick another window or submit without a window to queue.",
            fields={
                "cpus" if short == "cpus" else "memory_mib": (
                    "not free on the nodes with free GPUs for the whole window"
                )
            },
        )
    if not devices:
        what = f"{request.gpus} GPU(s)" if request.gpus else f"a {request.mig_profile} MIG slice"
        if request.gpu_fraction is not None or request.gpu_memory_mib is not None:
            what = "room on a shared GPU"
        model = f" of model {request.gpu_model}" if request.gpu_model else ""
        raise NoCapacity(
            f"No {what}{model} free for the whole window {request.start:%Y-%m-%d %H:%M} to "
            f"{request.end:%Y-%m-%d %H:%M} UTC ({free} matching device(s) free); "
            "pick another window or submit without a window to queue."
        )
    return devices


def booking_cancel(*, user, booking_id: int, now: datetime, source: Source = SYSTEM) -> Booking:
    """Cancel a pending, planned or active booking; its devices are freed at once."""
    return _end(
        user=user,
        booking_id=booking_id,
        now=now,
        new_state=State.CANCELLED,
        event="cancelled",
        action="booking.cancel",
        source=source,
    )


def booking_release(*, user, booking_id: int, now: datetime, source: Source = SYSTEM) -> Booking:
    """Hand back an active booking's devices early; it counts as finished."""
    return _release(
        user=user, booking_id=booking_id, now=now, source=source, action="booking.release"
    )


def booking_reclaim_release(*, booking_id: int, now: datetime) -> Booking:
    """Release an active booking for idleness (the site's idle reclaim, not its owner)."""
    return _release(
        user=None, booking_id=booking_id, now=now, source=SYSTEM, action="booking.reclaim"
    )


def _release(*, user, booking_id: int, now: datetime, source: Source, action: str) -> Booking:
    return _end(
        user=user,
        booking_id=booking_id,
        now=now,
        new_state=State.FINISHED,
        event="released",
        action=action,
        source=source,
    )


def _end(*, user, booking_id, now, new_state, event, action, source, detail: str = "") -> Booking:
    booking = (
        booking_get_for_change(user=user, booking_id=booking_id, action=action)
        if user
        else Booking.objects.get(pk=booking_id)
    )
    with transaction.atomic(durable=True):
        if not booking_transition(booking.pk, to=new_state, now=now, detail=detail):
            booking.refresh_from_db()
            raise InvalidState(f"Booking {booking.pk} is {booking.state}; it cannot be {event}.")
        before = booking_state(booking)
        booking.refresh_from_db()
        audit_booking(action=action, booking=booking, actor=user, source=source, before=before)
        events.booking_changed(booking, event, cause="owner" if user else "site")
    return booking


def booking_transition(booking_id: int, *, to: str, now: datetime, detail: str = "") -> bool:
    """Compare-and-set a booking into a terminal state and free its devices. False: someone else did.

    The states it may come from are the transition table's (transitions.TRANSITIONS). What the
    queue said about it (planned start, position, reason) goes: it no longer waits."""
    changed = booking_cas(
        booking_id,
        to=to,
        ended_at=now,
        state_detail=detail,
        planned_start=None,
        queue_position=None,
        pending_reason="",
    )
    if changed:
        allocations = Allocation.objects.filter(booking_id=booking_id, live=True)
        allocations.filter(start__lt=now).update(end=Least(F("end"), now), live=False)
        allocations.update(live=False)
        fairshare.allocations_measure(booking_id=booking_id, now=now)
    return bool(changed)


def booking_stop(*, booking_id: int, to: str, now: datetime, detail: str) -> str | None:
    """Stop an active booking that the site ended (preempted for another, or its node failed).

    The one requeue rule: a batch job (a command, no fixed window) with time left goes back to
    the queue, keeping its submit time and so its age; with REQUEUE_ON_NODE_FAILURE off, a node
    failure (or its agent's stop) ends it for good. Returns the event ("requeued", or the
    terminal state), None when the booking was no longer active. Runs inside the caller's
    transaction.
    """
    booking = Booking.objects.filter(pk=booking_id).select_related("project").first()
    time_left = Allocation.objects.filter(booking_id=booking_id, live=True, end__gt=now).exists()
    if booking is None or not booking_transition(booking_id, to=to, now=now, detail=detail):
        return None
    before = booking_state(booking)
    requeue = bool(booking.command) and booking.start is None and time_left
    if to == State.FAILED and not settings.REQUEUE_ON_NODE_FAILURE:
        requeue = False
    event = "requeued" if requeue else to
    if requeue:
        # A new run: nothing of the last one (its exit, log, devices: see requeued_at) shows.
        booking_cas(
            booking_id,
            to=State.PENDING,
            where={"state": to},
            ended_at=None,
            started_at=None,
            planned_start=None,
            requeued_at=now,
            exit_code=None,
            log_tail="",
            # The next run is a restart (GPU_PORTAL_RESTART_COUNT) and meets on a new port.
            restart_count=F("restart_count") + 1,
            master_port=None,
            # The next run starts within its limits or borrows again, as the allocator says.
            borrowed=False,
            borrowed_past="",
            state_detail=f"{detail}; requeued",
        )
    booking.refresh_from_db()
    # Named by the cause; the after state says whether it went back to the queue.
    if to == State.PREEMPTED:
        action = "booking.preempt"
    else:
        action = "booking.requeue" if requeue else "booking.fail"
    audit_booking(action=action, booking=booking, before=before)
    events.booking_changed(booking, event)
    return event


def booking_extend(
    *, user, booking_id: int, now: datetime, by_s: int, source: Source = SYSTEM
) -> Booking:
    """Make a booking longer by `by_s` seconds, if its devices are free that long (else 409)."""
    booking = booking_get_for_change(user=user, booking_id=booking_id, action="booking.extend")
    if by_s <= 0:
        raise ValidationFailed.field("by_s", "must be a positive number of seconds.")
    with transaction.atomic(durable=True):
        lock_quota_subjects(project_id=booking.project_id, user_id=booking.owner_id)
        lock_nodes(
            Allocation.objects.filter(booking=booking, live=True).values_list(
                "gpu__node_id", flat=True
            )
        )
        # Held to commit: a cancel or release racing in waits, instead of freeing the devices
        # between this state check and the writes below.
        booking = Booking.objects.select_for_update().get(pk=booking.pk)
        if booking.state not in Booking.LIVE_STATES:
            raise InvalidState(
                f"Booking {booking.pk} is {booking.state}; only live bookings can be extended."
            )
        _check_extend_quota(booking, by_s, now)
        before = booking_state(booking)
        if booking.state == State.PENDING:
            Booking.objects.filter(pk=booking.pk).update(duration_s=F("duration_s") + by_s)
        else:
            _extend_allocations(booking, timedelta(seconds=by_s))
        booking.refresh_from_db()
        audit_booking(
            action="booking.extend", booking=booking, actor=user, source=source, before=before
        )
        events.booking_changed(booking, "extended", cause="owner")
    return booking


def _check_extend_quota(booking: Booking, by_s: int, now: datetime) -> None:
    """The site maximum, the quota's maximum duration, then the one quota rule: over the added
    time (where it holds devices) its width against what else is held, and its GPU-hours still
    to run, longer now, against the budget left after what was used."""
    new_duration = booking.duration_s + by_s
    site_max = request_bounds().duration_max_s
    if new_duration > site_max:
        raise ValidationFailed.field(
            "by_s",
            f"would make the booking {new_duration} s long; bookings last at most {site_max} s "
            "on this site.",
        )
    window, rest_s = None, float(new_duration)
    spans = Allocation.objects.filter(booking=booking, live=True).aggregate(
        start=Min("start"), end=Max("end")
    )
    if booking.state != State.PENDING and spans["end"] is not None:
        window = (spans["end"], spans["end"] + timedelta(seconds=by_s))
        rest_s = (window[1] - max(now, spans["start"])).total_seconds()
    position = quota_position(
        project=booking.project,
        user=booking.owner,
        now=now,
        window=window,
        exclude_booking=booking.pk,
    )
    most = position.user_limits.max_duration_s
    if most and new_duration > most:
        reason = f"would make the booking {new_duration} s long; your quota allows {most} s."
        raise QuotaExceeded(
            f"Quota max_duration_s: {reason}",
            fields={"by_s": reason},
            extra={"limit": "max_duration_s", "limit_value": most},
        )
    width = booking.gpu_equivalents
    if booking.gpu_memory_mib is not None and booking.gpu_fraction is None:
        # A memory request holds the share it got on its GPU (at most 1 while it waits).
        held = Allocation.objects.filter(booking=booking, live=True).aggregate(s=Max("fraction"))
        width = held["s"] or width
    host = None
    if window is not None:  # what it holds on its nodes, held longer
        held = Allocation.objects.filter(booking=booking, live=True)
        host = host_demand(
            asked=(booking.cpus, booking.memory_mib),
            devices=held.values_list("gpu__node_id", "fraction"),
        )
    refusal = scheduler.position_refusal(
        position.sides, gpus=width, gpu_hours=width * rest_s / 3600, host=host
    )
    if refusal is not None:
        raise _quota_exceeded(refusal, concurrent="by_s", budget="by_s", where="in the added time")


def _extend_fraction(allocations: list[Allocation], *, start, end) -> None:
    """A fraction of a shared GPU is extended while its GPU has room for its share that long
    (the other fractions on it stay; under the node lock the caller holds)."""
    for a in allocations:
        if not share_fits(
            gpu_id=a.gpu_id, share=a.share, memory_mib=a.gpu_memory_mib, start=start, end=end
        ):
            raise NoCapacity(
                f"{a.device_label} has no room for this share of it from "
                f"{start:%Y-%m-%d %H:%M} UTC; extend by less.",
                fields={"by_s": "the shared GPU has no room that long"},
            )


def _extend_allocations(booking: Booking, by: timedelta) -> None:
    allocations = list(Allocation.objects.filter(booking=booking, live=True).select_related("gpu"))
    old_end = max(a.end for a in allocations)
    window = window_in_the_way(
        gpu_ids={a.gpu_id for a in allocations}, start=old_end, end=old_end + by
    )
    if window is not None:
        raise NoCapacity(
            f"Maintenance window {window.pk} ({window.reason}) takes these nodes from "
            f"{window.start:%Y-%m-%d %H:%M} UTC; extend by less.",
            fields={"by_s": "a maintenance window starts before then"},
        )
    if any(a.gpu_memory_mib is not None for a in allocations):
        _extend_fraction(allocations, start=old_end, end=old_end + by)
        other = None
    else:
        other = placement.first_clash(allocations, start=old_end, end=old_end + by)
    if other:
        raise NoCapacity(
            f"{other.device_label} is booked from {other.start:%Y-%m-%d %H:%M} UTC by another "
            "booking; extend by less.",
            fields={"by_s": "devices not free that long"},
        )
    if not resources_fit(
        booking_id=booking.pk,
        asked=(booking.cpus, booking.memory_mib),
        devices=[(a.gpu.node_id, a.fraction) for a in allocations],
        during=(old_end, old_end + by),
        policy=scheduler_policy(),
    ):
        raise NoCapacity(
            "Other bookings hold the cores or host memory of its nodes in the added time; "
            "extend by less.",
            fields={"by_s": "cores or memory of its nodes not free that long"},
        )
    try:
        with transaction.atomic():
            Allocation.objects.filter(booking=booking, live=True).update(end=F("end") + by)
    except (IntegrityError, OperationalError) as exc:
        if not is_allocation_clash(exc):
            raise
        raise NoCapacity("Another booking took these devices a moment ago.") from exc
    fields = {"duration_s": F("duration_s") + int(by.total_seconds())}
    if booking.end:
        fields["end"] = F("end") + by
    Booking.objects.filter(pk=booking.pk).update(**fields)
