"""Prometheus metrics, collected at scrape time from the cache (Redis) and PostgreSQL.

The counters themselves are recorded by portal/services/core/counters.py.

Nothing here runs per request. Processes that do the work (the Celery worker's pass, the web
process's lock timeouts and ingest) add to a few counters kept in the cache, so every web
process answers a scrape with the same numbers. Device gauges carry dcgm-exporter's names where
a reading matches, so dashboards built for dcgm-exporter work; labels are node, gpu, uuid,
mig_profile, model and the project holding the device now (no booking id: cardinality stays
bounded by the inventory and the projects). The one exception is the GPU memory of the processes
in the latest readings, summed per booking the agent names for them (a shared GPU's tenants
apart): its series are the bookings running now, one per booking and device, never per pid.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from datetime import UTC, datetime

from django.db.models import Count, Sum
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
)

from portal.models import Allocation, Booking, Gpu, MigInstance, Node
from portal.services.core import counters
from portal.services.inventory import telemetry_cache
from portal.services.inventory.resources import held_now_by_node, node_capacities

log = logging.getLogger(__name__)

MIG_SLICES = 7

# Latest-reading field -> (dcgm-exporter metric name, help text).
DEVICE_GAUGES = {
    "utilization_gpu": ("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %)."),
    "utilization_memory": ("DCGM_FI_DEV_MEM_COPY_UTIL", "Memory utilization (in %)."),
    "memory_used_mib": ("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB)."),
    "memory_free_mib": ("DCGM_FI_DEV_FB_FREE", "Framebuffer memory free (in MiB)."),
    "temperature_c": ("DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C)."),
    "power_w": ("DCGM_FI_DEV_POWER_USAGE", "Power draw (in W)."),
    "energy_mj": (
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
        "Total energy consumption since the driver was last reloaded (in mJ).",
    ),
}
DEVICE_LABELS = ["node", "gpu", "uuid", "mig_profile", "model", "project"]


# -- collecting (at scrape time) -----------------------------------------------------------


class PortalCollector:
    """Everything /metrics shows, read fresh on every scrape."""

    def collect(self):
        now = datetime.now(UTC)
        yield from _device_metrics(now)
        yield from _queue_metrics()
        yield from _pass_metrics()
        yield from _counter_metrics()
        yield from _node_metrics(now)
        yield from _node_resource_metrics(now)
        yield from _borrowed_metrics(now)


def _device_metrics(now: datetime):
    gpus = list(Gpu.objects.values("id", "index", "uuid", "model", "mig_mode", "node__hostname"))
    migs = list(
        MigInstance.objects.values(
            "id", "uuid", "profile", "gpu__index", "gpu__model", "gpu__node__hostname"
        )
    )
    gpu_project, mig_project = _projects_holding(now)
    devices = [
        (g["uuid"], g["node__hostname"], g["index"], "", g["model"], gpu_project.get(g["id"], ""))
        for g in gpus
    ] + [
        (
            m["uuid"],
            m["gpu__node__hostname"],
            m["gpu__index"],
            m["profile"],
            m["gpu__model"],
            mig_project.get(m["id"], ""),
        )
        for m in migs
    ]
    latest = telemetry_cache.latest_by_uuid([d[0] for d in devices])
    families = {
        field: GaugeMetricFamily(name, doc, labels=DEVICE_LABELS)
        for field, (name, doc) in DEVICE_GAUGES.items()
    }
    for uuid, node, index, profile, model, project in devices:
        reading = latest.get(uuid)
        if not reading:
            continue  # no recent reading: no sample (as dcgm-exporter for a field it lacks)
        values = dict(reading)
        used, total = values.get("memory_used_mib"), values.get("memory_total_mib")
        values["memory_free_mib"] = None if used is None or total is None else total - used
        labels = [node, str(index), uuid, profile, model, project]
        for field, family in families.items():
            if values.get(field) is not None:
                family.add_metric(labels, float(values[field]))
    yield from families.values()
    yield _booking_memory(devices, latest)


BOOKING_MEMORY = "gpu_portal_gpu_memory_used_by_booking_mib"
BOOKING_MEMORY_LABELS = ["node", "gpu", "uuid", "booking", "project"]


def _booking_memory(devices: list[tuple], latest: dict[str, dict]) -> GaugeMetricFamily:
    """The GPU memory of each booking's processes on each device, from the latest readings."""
    family = GaugeMetricFamily(
        BOOKING_MEMORY,
        "GPU memory used by a booking's processes on a device, in the latest reading (in MiB).",
        labels=BOOKING_MEMORY_LABELS,
    )
    used: dict[tuple[str, int], int] = defaultdict(int)
    for uuid, reading in latest.items():
        for process in reading.get("processes") or ():
            booking, memory = process.get("booking_id"), process.get("used_memory_mib")
            if booking is not None and memory is not None:
                used[(uuid, booking)] += memory
    projects = dict(
        Booking.objects.filter(pk__in={b for _, b in used}).values_list("pk", "project__slug")
    )
    where = {d[0]: (d[1], str(d[2])) for d in devices}
    for (uuid, booking), memory in sorted(used.items()):
        if uuid in where and booking in projects:
            node, gpu = where[uuid]
            family.add_metric([node, gpu, uuid, str(booking), projects[booking]], float(memory))
    return family


def _projects_holding(now: datetime) -> tuple[dict[int, str], dict[int, str]]:
    gpu_project: dict[int, str] = {}
    mig_project: dict[int, str] = {}
    rows = Allocation.objects.filter(live=True, start__lte=now, end__gt=now).values_list(
        "gpu_id", "mig_instance_id", "booking__project__slug"
    )
    for gpu_id, mig_id, slug in rows:
        if mig_id is None:
            gpu_project[gpu_id] = slug
        else:
            mig_project[mig_id] = slug
    return gpu_project, mig_project


def _queue_metrics():
    count = GaugeMetricFamily(
        "gpu_portal_bookings", "Bookings by state and project.", labels=["state", "project"]
    )
    gpus = GaugeMetricFamily(
        "gpu_portal_gpu_equivalents",
        "GPUs asked for by bookings (a MIG slice counts slices/7, a fraction of a shared GPU "
        "its share), by state and project.",
        labels=["state", "project"],
    )
    totals: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0, 0.0])
    rows = (
        Booking.objects.filter(state__in=Booking.LIVE_STATES)
        .values("state", "project__slug", "gpus", "mig_profile", "gpu_fraction")
        .annotate(n=Count("id"))
    )
    for row in rows:
        total = totals[(row["state"], row["project__slug"])]
        total[0] += row["n"]
        share = row["gpu_fraction"]
        width = share if share is not None else _gpu_equivalents(row["gpus"], row["mig_profile"])
        total[1] += row["n"] * width
    for state in Booking.LIVE_STATES:  # every live state shows, at 0 too, for alert rules
        if not any(key[0] == state for key in totals):
            totals[(str(state), "")] = [0, 0.0]
    for (state, project), (n, equivalents) in sorted(totals.items()):
        count.add_metric([state, project], n)
        gpus.add_metric([state, project], round(equivalents, 4))
    yield count
    yield gpus


def _borrowed_metrics(now: datetime):
    """GPU-equivalents held now, within quota and borrowed past it, by project (elastic quotas:
    the rate of borrowed GPU-hours; accounting reports the hours themselves)."""
    held = GaugeMetricFamily(
        "gpu_portal_held_gpu_equivalents",
        "GPU-equivalents held now by running bookings, by project and whether borrowed past its"
        " quota's concurrency limit.",
        labels=["project", "borrowed"],
    )
    rows = (
        Allocation.objects.filter(live=True, start__lte=now, end__gt=now)
        .values("booking__project__slug", "borrowed")
        .annotate(total=Sum("fraction"))
        .order_by("booking__project__slug", "borrowed")
    )
    for row in rows:
        labels = [row["booking__project__slug"], "true" if row["borrowed"] else "false"]
        held.add_metric(labels, round(row["total"], 4))
    yield held


def _gpu_equivalents(gpus: int, mig_profile: str) -> float:
    # A MIG booking is one instance of its profile ("3g.40gb": 3 of a GPU's 7 slices).
    if mig_profile:
        head = mig_profile.split("g.", 1)[0]
        return (int(head) if head.isdigit() else 1) / MIG_SLICES
    return float(gpus)


def _pass_metrics():
    names = [f"pass:bucket:{le}" for le in counters.PASS_BUCKETS] + [
        "pass:bucket:inf",
        "pass:sum_us",
    ]
    stored = counters.counter_values(names)
    cumulative, buckets = 0, []
    for le in counters.PASS_BUCKETS:
        cumulative += stored.get(f"pass:bucket:{le}", 0)
        buckets.append((str(le), cumulative))
    cumulative += stored.get("pass:bucket:inf", 0)
    buckets.append(("+Inf", cumulative))
    yield HistogramMetricFamily(
        "gpu_portal_allocation_pass_seconds",
        "Duration of the allocation pass (snapshot, plan, start, store).",
        buckets=buckets,
        sum_value=stored.get("pass:sum_us", 0) / 1_000_000,
    )
    last = counters.last_pass_at()
    if last is not None:
        yield GaugeMetricFamily(
            "gpu_portal_allocation_pass_last_timestamp_seconds",
            "Unix time at which the last allocation pass ended.",
            value=last,
        )


COUNTERS = {
    "lock_timeouts": "Requests refused busy (503) because a row lock was not granted in time.",
    "readings_ingested": "Device readings stored from node agents.",
    "estimate_snapshots": "Copies of the queue read for start estimates (one serves "
    "ESTIMATE_SNAPSHOT_TTL_S seconds of them).",
    "outbox_given_up": "Domain facts whose subscribers kept failing and are no longer retried "
    "(outbox.MAX_ATTEMPTS).",
    "notification_failures:email": "Notifications that could not be sent, by channel.",
    "notification_failures:slack": "Notifications that could not be sent, by channel.",
}


def _counter_metrics():
    stored = counters.counter_values(list(COUNTERS))
    yield CounterMetricFamily(
        "gpu_portal_lock_timeouts",
        COUNTERS["lock_timeouts"],
        value=stored.get("lock_timeouts", 0),
    )
    yield CounterMetricFamily(
        "gpu_portal_readings_ingested",
        COUNTERS["readings_ingested"],
        value=stored.get("readings_ingested", 0),
    )
    yield CounterMetricFamily(
        "gpu_portal_estimate_snapshots",
        COUNTERS["estimate_snapshots"],
        value=stored.get("estimate_snapshots", 0),
    )
    yield CounterMetricFamily(
        "gpu_portal_outbox_given_up",
        COUNTERS["outbox_given_up"],
        value=stored.get("outbox_given_up", 0),
    )
    failures = CounterMetricFamily(
        "gpu_portal_notification_failures",
        COUNTERS["notification_failures:email"],
        labels=["channel"],
    )
    for channel in ("email", "slack"):
        failures.add_metric([channel], stored.get(f"notification_failures:{channel}", 0))
    yield failures


def _node_metrics(now: datetime):
    age = GaugeMetricFamily(
        "gpu_portal_agent_last_seen_age_seconds",
        "Seconds since the node's agent last reported.",
        labels=["node"],
    )
    up = GaugeMetricFamily(
        "gpu_portal_node_up", "1 when the node is up (its agent reports), else 0.", labels=["node"]
    )
    for hostname, state, last_seen in Node.objects.order_by("hostname").values_list(
        "hostname", "state", "heartbeat__last_seen"
    ):
        if last_seen is not None:
            age.add_metric([hostname], max(0.0, (now - last_seen).total_seconds()))
        up.add_metric([hostname], 1.0 if state == Node.State.UP else 0.0)
    yield age
    yield up


NODE_RESOURCE_GAUGES = (
    ("gpu_portal_node_cpus", "CPU cores jobs may use on the node, as its agent reports."),
    ("gpu_portal_node_cpus_allocated", "CPU cores held now by running bookings on the node."),
    ("gpu_portal_node_memory_mib", "Host memory jobs may use on the node (in MiB)."),
    (
        "gpu_portal_node_memory_mib_allocated",
        "Host memory held now by running bookings on the node (in MiB).",
    ),
)


def _node_resource_metrics(now: datetime):
    """Cores and host memory per node, capacity and held now (docs/scheduling.md, "Cores and
    memory"); a node whose agent reports none has no sample."""
    families = [GaugeMetricFamily(name, doc, labels=["node"]) for name, doc in NODE_RESOURCE_GAUGES]
    capacities = node_capacities()
    held = held_now_by_node(now, capacities)
    hostnames = dict(Node.objects.filter(pk__in=list(capacities)).values_list("pk", "hostname"))
    for node_id, hostname in sorted(hostnames.items(), key=lambda item: item[1]):
        capacity, (cpus, memory_mib) = capacities[node_id], held[node_id]
        values = (capacity.cpus, cpus, capacity.memory_mib, memory_mib)
        for family, value in zip(families, values, strict=True):
            family.add_metric([hostname], float(value))
    yield from families
