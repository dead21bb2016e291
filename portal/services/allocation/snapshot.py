"""The ORM as the pure scheduler sees it: one snapshot of devices, allocations, queue and quotas.

Used by the allocation pass and by the start estimate, so both judge a booking the same way.
Every table is read once, whatever the number of users, projects or pending bookings: quotas
and GPU-hour use come from one query each, not one per user.
"""

from collections import defaultdict
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import NamedTuple

from django.db import connection, transaction
from django.db.models import Max, TextField
from django.db.models.functions import Cast

import scheduler
import scheduler.holds
from agents.protocol import image_runtimes
from portal.models import Allocation, Booking, Gpu, mig_fraction
from portal.models.inventory import runtimes_of
from portal.services.booking import fairshare
from portal.services.booking.dependencies import array_limit, pending_dependencies
from portal.services.booking.project_reservations import hold_rules
from portal.services.booking.quotas import QuotaAsk, quota_positions
from portal.services.core.clock import EpochSeconds, to_epoch
from portal.services.core.policy import scheduler_policy
from portal.services.inventory import resources
from portal.services.inventory import selectors as inventory
from portal.services.inventory.mig_layouts import mig_changes_holding
from portal.services.inventory.telemetry_cache import latest_by_uuid
from portal.services.inventory.windows import maintenance_windows_planned

State = Booking.State


def _ts(value: datetime) -> float:
    return to_epoch(value)


def _user_key(booking: Booking) -> str:
    # Quotas are per user within a project, so the allocator's "user" is the pair.
    return f"{booking.owner.username}@{booking.project.slug}"


@dataclass(frozen=True)
class DeviceRow:
    """Where a scheduler device lives in the database, to write its allocation."""

    node_id: int
    gpu_id: int
    mig_id: int | None
    fraction: float
    # A fraction of a shared GPU: the share and memory the booking holds (share_row); a whole
    # device has no memory figure.
    share: float = 1.0
    memory_mib: int | None = None


def share_row(row: DeviceRow, start) -> DeviceRow:
    """The row a booking's start (``scheduler.Start``) writes: for a fraction of a shared GPU,
    the share and memory the allocator gave it there, charged as its GPU-equivalents."""
    if start.share >= 1.0 and not start.gpu_memory_mib:
        return row
    return replace(row, fraction=start.share, share=start.share, memory_mib=start.gpu_memory_mib)


class PendingRow(NamedTuple):
    """A pending booking as read, with its stored plan (to write only what changes).

    ``plan_values`` is (planned start in epoch seconds, position, reason, detail, priority as
    the database's JSON text).
    """

    pk: int
    project_id: int
    duration_s: int
    plan_values: tuple
    # Cores and host memory per node it asked for (None: the default, resources.node_demand).
    cpus: int | None = None
    memory_mib: int | None = None


@dataclass(frozen=True)
class Snapshot:
    """What one allocation pass plans from, read in one consistent read."""

    state: object  # scheduler.State
    devices: dict[str, DeviceRow]
    pending: dict[int, PendingRow]
    last_allocation_id: int
    recent_runs: dict[str, list[float]] = field(default_factory=dict)  # for run prediction
    policy: object = None  # the scheduler.Policy it was read with, the one its plan uses


_PENDING_FIELDS = (
    "pk",
    "owner_id",
    "owner__username",
    "project_id",
    "project__slug",
    "submitted_ts",
    "duration_s",
    "gpus",
    "mig_profile",
    "gpu_model",
    "qos",
    "preemptible",
    "planned_ts",
    "queue_position",
    "pending_reason",
    "state_detail",
    "priority_text",
    "array_parent_id",
    "array_spec",
    "image",
    "mixed_models",
    "gpu_fraction",
    "gpu_memory_mib",
    "requeued_ts",
    "restart_count",
    "cpus",
    "memory_mib",
)


def snapshot_take(*, now: datetime, policy=None) -> Snapshot:
    """Read the queue, devices, allocations and quotas for a pass, in one consistent read.

    ``policy`` (default: built from settings) is kept on the snapshot: the snapshot's reads (run
    prediction, fair share) and the plan all use that one."""
    policy = policy or scheduler_policy()
    outermost = not connection.in_atomic_block
    with transaction.atomic():
        if connection.vendor == "postgresql" and outermost:
            with connection.cursor() as cursor:
                cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
        last = Allocation.objects.aggregate(last=Max("pk"))["last"] or 0
        rows = list(
            Booking.objects.filter(state=State.PENDING)
            .annotate(
                submitted_ts=EpochSeconds("submitted_at"),
                planned_ts=EpochSeconds("planned_start"),
                requeued_ts=EpochSeconds("requeued_at"),
                # The stored priority only to compare with the new one: text, not decoded.
                priority_text=Cast("priority", TextField()),
            )
            .order_by("submitted_at", "id")
            .values_list(*_PENDING_FIELDS)
        )
        after, outcomes = pending_dependencies()
        requests = [_request_row(row, after.get(row[0], ()), policy) for row in rows]
        keys = {(row[3], row[1]): (row[4], row[2]) for row in rows}
        state, devices, recent = _state(now, requests, keys, policy)
        state = replace(state, outcomes=outcomes)
    pending = {
        row[0]: PendingRow(
            row[0],
            row[3],
            row[6],
            (_whole(row[12]), row[13], row[14], row[15], row[16]),
            row[25],
            row[26],
        )
        for row in rows
    }
    return Snapshot(state, devices, pending, last, recent, policy)


def _whole(ts: float | None) -> int | None:
    return None if ts is None else round(ts)


def _request_row(row: tuple, after: tuple, policy):
    requeued = row[23]
    return scheduler.Request(
        booking_id=str(row[0]),
        user=f"{row[2]}@{row[4]}",
        project=row[4],
        submit_time=row[5],
        duration_s=float(row[6]),
        gpus=row[7] or 1,
        mig_profile=row[8] or None,
        gpu_model=row[9] or None,
        qos=row[10],
        preemptible=row[11],
        after=after,
        array=str(row[17] or ""),
        array_limit=array_limit(row[18]),
        runtimes=_runtimes(row[19]),
        mixed_models=row[20],
        gpu_fraction=row[21],
        gpu_memory_mib=row[22],
        # A requeued run backs off before it borrows again (scheduler.borrow_backoff).
        borrow_after=0.0
        if requeued is None
        else scheduler.borrow_backoff(policy, requeued, row[24]),
        cpus=row[25],
        memory_mib=row[26],
    )


def _runtimes(image: str) -> tuple[str, ...]:
    # A booking in a container needs a node with a runtime that can run its image.
    return image_runtimes(image) if image else ()


def snapshot_plus(snap: Snapshot, *, now: datetime, bookings: list[Booking]):
    """The snapshot's scheduler State with these unsaved bookings queued too (see
    ``snapshot_extra``): the state ``plan()`` of an estimate sees."""
    requests, user_quotas, project_quotas, shares = snapshot_extra(snap, now=now, bookings=bookings)
    state = snap.state
    return replace(
        state,
        pending=state.pending + requests,
        user_quotas={**state.user_quotas, **user_quotas},
        project_quotas={**state.project_quotas, **project_quotas},
        project_shares={**state.project_shares, **shares},
    )


def snapshot_extra(snap: Snapshot, *, now: datetime, bookings: list[Booking]):
    """These unsaved bookings as the scheduler's requests, and the user quotas, project quotas
    and project shares the snapshot lacks for them, read at ``now``.

    The snapshot's own quotas stand for owners and projects it has (one consistent read, at the
    snapshot's time like the rest of the queue): the walk an estimate resumes was planned with
    them. Owners or projects with nothing queued are read afresh.
    """
    state = snap.state
    keys = {
        (b.project.pk, b.owner.pk): (b.project.slug, b.owner.username)
        for b in bookings
        if _user_key(b) not in state.user_quotas or b.project.slug not in state.project_quotas
    }
    user_quotas, project_quotas, shares = _quotas(now, keys) if keys else ({}, {}, {})
    requests = tuple(_predicted(_request(b), snap.recent_runs) for b in bookings)
    return (
        requests,
        {key: quota for key, quota in user_quotas.items() if key not in state.user_quotas},
        {key: quota for key, quota in project_quotas.items() if key not in state.project_quotas},
        {key: share for key, share in shares.items() if key not in state.project_quotas},
    )


def _quotas(now: datetime, keys: dict[tuple[int, int], tuple[str, str]]):
    """The scheduler's user and project quotas (with use) and project shares for these
    (project id, user id): (slug, username) pairs, read by the one quota position reader."""
    positions = quota_positions(now=now, asks={pair: QuotaAsk(*pair) for pair in keys})
    quotas_user: dict[str, scheduler.Quota] = {}
    quotas_project: dict[str, scheduler.Quota] = {}
    shares: dict[str, float] = {}
    for pair, (slug, username) in keys.items():
        position = positions[pair]
        quotas_user[f"{username}@{slug}"] = position.user.quota
        quotas_project[slug] = position.project.quota
        shares[slug] = position.project_limits.shares
    return quotas_user, quotas_project, shares


def _predicted(request, recent: dict[str, list[float]]):
    if not recent:
        return request
    return replace(
        request, duration_s=scheduler.predict_run(recent.get(request.user, ()), request.duration_s)
    )


def _state(now: datetime, requests: list, keys: dict[tuple[int, int], tuple[str, str]], policy):
    devices = _devices()
    quotas_user, quotas_project, shares = _quotas(now, keys)
    allocations = _allocations(now)
    recent = _recent_runs(policy.predict_last, now)
    # Run-time prediction (docs/scheduling.md): plan with the predicted run, the booking's
    # own end stays the hard end; a running booking past its prediction is planned to its end.
    requests = tuple(_predicted(r, recent) for r in requests)
    if recent:
        allocations = tuple(
            _predicted_end(a, recent.get(a.user, ()), _ts(now)) for a in allocations
        )
    inventory_devices = tuple(d for d, _ in devices.values())
    state = scheduler.State(
        now=_ts(now),
        devices=inventory_devices,
        allocations=allocations,
        pending=requests,
        project_shares=shares,
        project_usage=fairshare.project_usage(now=now, policy=policy),
        user_quotas=quotas_user,
        project_quotas=quotas_project,
        windows=maintenance_windows_planned(now=now),
        mig_changes=mig_changes_holding(),
        # Project reservations, each window expanded within the horizon (scheduler.holds).
        holds=scheduler.holds.expand(hold_rules(now=now), inventory_devices, allocations, _ts(now)),
        node_resources=_node_resources(devices),
    )
    return state, {key: row for key, (_, row) in devices.items()}, recent


def _node_resources(devices: dict[str, tuple]) -> dict[str, scheduler.NodeResources]:
    """Cores and memory of the nodes with bookable devices, by the name their devices give
    (``Device.node``); a node whose agent reported none is left out (it counts neither)."""
    names = {row.node_id: device.node for device, row in devices.values()}
    capacities = resources.node_capacities(names)
    return {names[node_id]: capacity for node_id, capacity in capacities.items()}


def _devices() -> dict[str, tuple]:
    """Scheduler devices keyed by id, with the rows to write their allocations."""
    # Rows, not model instances: one query per table and nothing built per device but the
    # scheduler's own objects.
    gpus = list(
        inventory.gpus_bookable().values_list(
            "pk",
            "uuid",
            "model",
            "node_id",
            "node__hostname",
            "node__state",
            "node__container_runtimes",
            "node__network_group",
            "index",
            "numa_node",
            "nvlink_peers",
            "memory_mib",
            "sharing",
        )
    )
    migs = inventory.mig_instances_bookable().values_list(
        "pk",
        "profile",
        "slices",
        "gpu_id",
        "gpu__model",
        "gpu__node_id",
        "gpu__node__hostname",
        "gpu__node__state",
        "gpu__node__container_runtimes",
        "gpu__node__network_group",
    )
    readings = latest_by_uuid([row[1] for row in gpus])
    # NVLink peers are reported by index on their node: the scheduler names them by device id.
    slot = {(row[3], row[8]): f"gpu:{row[0]}" for row in gpus}
    devices: dict[str, tuple] = {}
    for row in gpus:
        pk, uuid, model, node_id, hostname, node_state, runtimes, group, _, numa, peers = row[:11]
        memory_mib, sharing = row[11:]
        reading = readings.get(uuid, {})
        devices[f"gpu:{pk}"] = (
            scheduler.Device(
                id=f"gpu:{pk}",
                node=hostname,
                model=model,
                fraction=1.0,
                node_state=node_state,
                temperature_c=reading.get("temperature_c"),
                utilization=reading.get("utilization_gpu"),
                runtimes=runtimes_of(runtimes),
                links=tuple(slot[node_id, p] for p in peers or () if (node_id, p) in slot),
                numa=numa,
                group=group,
                shared=sharing == Gpu.Sharing.SHARED,
                memory_mib=memory_mib,
            ),
            DeviceRow(node_id, pk, None, 1.0),
        )
    for pk, profile, slices, gpu_id, model, node_id, hostname, node_state, runtimes, group in migs:
        fraction = mig_fraction(slices)
        devices[f"mig:{pk}"] = (
            scheduler.Device(
                id=f"mig:{pk}",
                node=hostname,
                model=model,
                profile=profile,
                fraction=fraction,
                node_state=node_state,
                parent=f"gpu:{gpu_id}",
                runtimes=runtimes_of(runtimes),
                group=group,
            ),
            DeviceRow(node_id, gpu_id, pk, fraction),
        )
    return devices


def _allocations(now: datetime) -> tuple:
    grouped: dict[int, list[tuple]] = defaultdict(list)
    live_rows = (
        Allocation.objects.filter(live=True, end__gt=now)
        .annotate(start_ts=EpochSeconds("start"), end_ts=EpochSeconds("end"))
        .values_list(
            "booking_id",
            "gpu_id",
            "mig_instance_id",
            "start_ts",
            "end_ts",
            "booking__owner__username",
            "booking__project__slug",
            "booking__qos",
            "booking__preemptible",
            "booking__state",
            "booking__array_parent_id",
            "share",
            "gpu_memory_mib",
            "borrowed",
            "booking__cpus",
            "booking__memory_mib",
        )
    )
    for row in live_rows:
        grouped[row[0]].append(row)
    out = []
    for booking_id, rows in grouped.items():
        first = rows[0]
        out.append(
            scheduler.Allocation(
                booking_id=str(booking_id),
                device_ids=tuple(sorted(f"mig:{r[2]}" if r[2] else f"gpu:{r[1]}" for r in rows)),
                start=min(r[3] for r in rows),
                end=max(r[4] for r in rows),
                user=f"{first[5]}@{first[6]}",
                project=first[6],
                qos=first[7],
                preemptible=first[8] or first[13],  # a borrowed run is always preemptible
                running=first[9] == State.ACTIVE,
                array=str(first[10] or ""),
                share=first[11],
                gpu_memory_mib=first[12] or 0,
                borrowed=first[13],
                cpus=first[14],
                memory_mib=first[15],
            )
        )
    return tuple(sorted(out, key=lambda a: a.booking_id))


def _recent_runs(last: int, now: datetime) -> dict[str, list[float]]:
    """Run seconds of each user's (user@project) ``last`` latest finished bookings."""
    if not last:
        return {}
    runs: dict[str, list[float]] = defaultdict(list)
    finished = (
        Booking.objects.filter(state=State.FINISHED, started_at__isnull=False, ended_at__lte=now)
        .order_by("-ended_at")
        .values_list("owner__username", "project__slug", "started_at", "ended_at")[:10_000]
    )
    for username, project, started, ended in finished:
        key = f"{username}@{project}"
        if len(runs[key]) < last:
            runs[key].append((ended - started).total_seconds())
    return runs


def _predicted_end(alloc, recent: list[float], now: float):
    if not alloc.running or not recent:
        return alloc
    end = alloc.start + scheduler.predict_run(recent, alloc.end - alloc.start)
    return replace(alloc, end=end) if end > now else alloc


def _request(booking: Booking):
    return scheduler.Request(
        booking_id=str(booking.pk),
        user=_user_key(booking),
        project=booking.project.slug,
        submit_time=_ts(booking.submitted_at),
        duration_s=float(booking.duration_s),
        gpus=booking.gpus or 1,
        mig_profile=booking.mig_profile or None,
        gpu_model=booking.gpu_model or None,
        qos=booking.qos,
        preemptible=booking.preemptible,
        runtimes=_runtimes(booking.image),
        mixed_models=booking.mixed_models,
        gpu_fraction=booking.gpu_fraction,
        gpu_memory_mib=booking.gpu_memory_mib,
        cpus=booking.cpus,
        memory_mib=booking.memory_mib,
    )
