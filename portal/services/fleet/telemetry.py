"""Telemetry: ingest of agent readings, per-minute rollups, pruning, and history for charts.

Raw samples go to PostgreSQL with COPY (one transaction per batch, no per-row queries); the
latest reading of each device goes to the cache for live views; after commit the batch is
broadcast to the channel-layer group "telemetry". Raw samples are kept
TELEMETRY_RAW_RETENTION_H hours; per-minute rollups, process rollups and node alerts
TELEMETRY_ROLLUP_RETENTION_D days (since last seen).
"""

import time
from datetime import datetime, timedelta

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Avg, Count, Max, Min
from django.db.models.functions import Coalesce, TruncMinute

from agents.protocol import DeviceReading, ReadingsRequest, to_json
from portal.errors import ValidationFailed
from portal.models import Allocation, Gpu, MigInstance, Node, ProcessUsage, Sample, SampleMinute
from portal.services.core import counters
from portal.services.fleet.alerts import node_alerts_prune
from portal.services.fleet.nodes import node_check_hostname
from portal.services.inventory import telemetry_cache
from portal.services.realtime.live_nowait import live_send_nowait

TELEMETRY_GROUP = "telemetry"
# Minutes already rolled up are recomputed this far back, to count samples that arrived late.
ROLLUP_OVERLAP = timedelta(minutes=5)

SAMPLE_VALUES = _VALUES = (
    "utilization_gpu",
    "utilization_memory",
    "memory_used_mib",
    "memory_total_mib",
    "temperature_c",
    "power_w",
)
_COLUMNS = ("node_id", "uuid", "time", *_VALUES)


def node_device_uuids(*, node_id: int) -> set[str]:
    """UUIDs of the node's GPUs and MIG instances, in one query."""
    # order_by(): SQLite refuses the models' default ordering inside a UNION.
    gpus = Gpu.objects.filter(node_id=node_id).order_by().values_list("uuid", flat=True)
    migs = (
        MigInstance.objects.filter(gpu__node_id=node_id).order_by().values_list("uuid", flat=True)
    )
    return set(gpus.union(migs))


# node id -> (read at, device UUIDs): ingest checks every batch against the node's devices, and
# a query per batch would cost more than the write. An unknown UUID re-reads before refusing,
# so a device added at register is accepted at once; a removed one is forgotten within the TTL.
_DEVICE_TTL_S = 60.0
_devices: dict[int, tuple[float, frozenset[str]]] = {}


def node_devices_forget(*, node_id: int) -> None:
    """Drop this process's cached device list of the node (its inventory just changed)."""
    _devices.pop(node_id, None)


def _unknown_uuid(node_id: int, uuids: list[str]) -> int | None:
    """Index of the first UUID that is not a device of the node, else None."""
    read_at, known = _devices.get(node_id, (0.0, frozenset()))
    fresh = time.monotonic() - read_at < _DEVICE_TTL_S
    if fresh and all(u in known for u in uuids):
        return None
    known = frozenset(node_device_uuids(node_id=node_id))
    _devices[node_id] = (time.monotonic(), known)
    return next((i for i, u in enumerate(uuids) if u not in known), None)


def samples_ingest(*, node: Node, request: ReadingsRequest) -> int:
    """Store one batch of readings of `node` (all or nothing) and publish them after commit.

    The batch must be the node's own (hostname) and name only its devices (uuid): otherwise
    nothing is stored. Returns the number of readings stored.
    """
    node_check_hostname(node=node, hostname=request.hostname)
    index = _unknown_uuid(node.pk, [r.uuid for r in request.readings])
    if index is not None:
        uuid = request.readings[index].uuid
        raise ValidationFailed.field(
            f"readings[{index}].uuid", f"{uuid} is not a device of {node.hostname}"
        )
    rows = [(node.pk, r.uuid, request.time, *_values(r)) for r in request.readings]
    with transaction.atomic():
        _write(rows)
        processes_rollup(node=node, request=request)
        transaction.on_commit(lambda: _publish(node.hostname, request), robust=True)
    return len(rows)


def processes_rollup(*, node: Node, request: ReadingsRequest) -> int:
    """Fold the batch's per-process readings into one ProcessUsage row per process and booking
    (first and last seen, peak memory, sample count). Returns the processes seen."""
    seen = [(r.uuid, p) for r in request.readings for p in r.processes]
    if not seen:
        return 0
    holders: dict[str, set[int]] = {}
    for uuid, booking_id in Allocation.objects.filter(
        gpu__node=node, live=True, start__lte=request.time, end__gt=request.time
    ).values_list(Coalesce("mig_instance__uuid", "gpu__uuid"), "booking_id"):
        holders.setdefault(uuid, set()).add(booking_id)
    rows = {}
    for uuid, p in seen:
        booking_id = _holder_of(p, holders.get(uuid, set()))
        key = (uuid, booking_id or 0, p.pid, p.user or "", (p.name or "")[:64])
        rows[key] = (*key, booking_id, p.used_memory_mib, not holders.get(uuid))
    table = ProcessUsage._meta.db_table
    greatest = "GREATEST" if connection.vendor == "postgresql" else "MAX"
    sql = f"""
        INSERT INTO {table} (node_id, device_uuid, booking_key, pid, "user", name, booking_id,
                             peak_memory_mib, "foreign", first_seen, last_seen, samples)
        VALUES {", ".join(["(%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, 1)"] * len(rows))}
        ON CONFLICT (device_uuid, booking_key, pid, "user", name) DO UPDATE SET
            last_seen = {greatest}({table}.last_seen, EXCLUDED.last_seen),
            first_seen = CASE WHEN {table}.first_seen < EXCLUDED.first_seen
                              THEN {table}.first_seen ELSE EXCLUDED.first_seen END,
            peak_memory_mib = COALESCE({greatest}({table}.peak_memory_mib,
                                                  EXCLUDED.peak_memory_mib),
                                       {table}.peak_memory_mib, EXCLUDED.peak_memory_mib),
            samples = {table}.samples + 1
    """
    params = []
    for row in rows.values():
        params += [node.pk, *row, request.time, request.time]
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
    return len(rows)


def _holder_of(process, holding: set[int]) -> int | None:
    """The booking a process on a device is counted for: the one its agent names, if that
    booking holds the device (a shared GPU's tenants); else the device's one holder."""
    if process.booking_id in holding:
        return process.booking_id
    return next(iter(holding)) if len(holding) == 1 else None


def _values(reading: DeviceReading) -> tuple:
    return tuple(getattr(reading, name) for name in _VALUES)


def _write(rows: list[tuple]) -> None:
    if not rows:
        return
    if connection.vendor != "postgresql":  # embedded mode (SQLite)
        Sample.objects.bulk_create(Sample(**dict(zip(_COLUMNS, row, strict=True))) for row in rows)
        return
    sql = f"COPY {Sample._meta.db_table} ({', '.join(_COLUMNS)}) FROM STDIN"
    with connection.cursor() as cursor:
        # Samples are not worth an fsync wait each: a crash may lose the last fraction of a
        # second of telemetry, never consistency. Only this transaction is affected.
        cursor.execute("SET LOCAL synchronous_commit = off")
        with cursor.cursor.copy(sql) as copy:
            for row in rows:
                copy.write_row(row)


def _publish(hostname: str, request: ReadingsRequest) -> None:
    when = to_json(request)["time"]
    readings = [to_json(r) for r in request.readings]
    telemetry_cache.latest_store(
        {r["uuid"]: {**r, "node": hostname, "time": when} for r in readings}
    )
    counters.counter_add("readings_ingested", len(readings))
    live_send_nowait(
        TELEMETRY_GROUP,
        {"type": "telemetry.readings", "node": hostname, "time": when, "readings": readings},
    )


def samples_rollup(*, now: datetime) -> int:
    """Roll raw samples up into per-minute rows, upserted per (device, minute); idempotent.

    Only whole minutes (before `now`'s minute) are rolled up. Each run recomputes the minutes
    since the last rollup minus ROLLUP_OVERLAP from the raw samples, so re-running (or late
    samples) never double counts. Returns the number of minute rows written.
    """
    until = floor_minute(now)
    since = _rollup_since(now, until)
    groups = (
        Sample.objects.filter(time__gte=since, time__lt=until)
        .annotate(minute=TruncMinute("time"))
        .values("uuid", "minute")
        .annotate(
            node=Max("node_id"),
            samples=Count("id"),
            utilization_gpu_avg=Avg("utilization_gpu"),
            utilization_gpu_max=Max("utilization_gpu"),
            utilization_memory_avg=Avg("utilization_memory"),
            memory_used_mib_avg=Avg("memory_used_mib"),
            memory_used_mib_max=Max("memory_used_mib"),
            memory_total=Max("memory_total_mib"),
            temperature_c_avg=Avg("temperature_c"),
            temperature_c_max=Max("temperature_c"),
            power_w_avg=Avg("power_w"),
        )
        .order_by("uuid", "minute")
    )
    rows = [_minute_row(group) for group in groups]
    SampleMinute.objects.bulk_create(
        rows,
        batch_size=1000,
        update_conflicts=True,
        unique_fields=["uuid", "minute"],
        update_fields=[f.name for f in SampleMinute._meta.concrete_fields if f.name != "id"],
    )
    return len(rows)


def _rollup_since(now: datetime, until: datetime) -> datetime:
    oldest_raw = floor_minute(now - timedelta(hours=settings.TELEMETRY_RAW_RETENTION_H))
    last = SampleMinute.objects.aggregate(last=Max("minute"))["last"]
    if last is None:
        first = Sample.objects.aggregate(first=Min("time"))["first"]
        since = floor_minute(first) if first else until
    else:
        since = min(last, until) - ROLLUP_OVERLAP
    return max(since, oldest_raw)


def _minute_row(group: dict) -> SampleMinute:
    return SampleMinute(
        node_id=group["node"],
        uuid=group["uuid"],
        minute=group["minute"],
        samples=group["samples"],
        utilization_gpu_avg=group["utilization_gpu_avg"],
        utilization_gpu_max=group["utilization_gpu_max"],
        utilization_memory_avg=group["utilization_memory_avg"],
        memory_used_mib_avg=group["memory_used_mib_avg"],
        memory_used_mib_max=group["memory_used_mib_max"],
        memory_total_mib=group["memory_total"],
        temperature_c_avg=group["temperature_c_avg"],
        temperature_c_max=group["temperature_c_max"],
        power_w_avg=group["power_w_avg"],
    )


def samples_prune(*, now: datetime) -> tuple[int, int]:
    """Delete raw samples and rollups past their retention; (raw deleted, rollups deleted)."""
    raw_before = now - timedelta(hours=settings.TELEMETRY_RAW_RETENTION_H)
    rollup_before = now - timedelta(days=settings.TELEMETRY_ROLLUP_RETENTION_D)
    raw, _ = Sample.objects.filter(time__lt=raw_before).delete()
    minutes, _ = SampleMinute.objects.filter(minute__lt=rollup_before).delete()
    return raw, minutes


def telemetry_maintain(*, now: datetime) -> dict:
    """The periodic job: roll up first (so nothing is pruned unrolled), then prune."""
    rolled = samples_rollup(now=now)
    raw, minutes = samples_prune(now=now)
    # Process rollups live as long as the minute rollups.
    before = now - timedelta(days=settings.TELEMETRY_ROLLUP_RETENTION_D)
    processes, _ = ProcessUsage.objects.filter(last_seen__lt=before).delete()
    return {
        "rolled_up": rolled,
        "raw_pruned": raw,
        "rollups_pruned": minutes,
        "processes_pruned": processes,
        # The alerts that mark those processes, on the same retention.
        "alerts_pruned": node_alerts_prune(now=now),
    }


def floor_minute(moment: datetime) -> datetime:
    return moment.replace(second=0, microsecond=0)
