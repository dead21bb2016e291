"""The busiest list endpoints' rows, read as plain values rather than model instances.

GET bookings/ and gpus/ are what scripts poll; building 50 bookings with their allocations, GPUs
and nodes as model instances and rendering them field by field cost several times the rest of the
request. These read the same columns with `.values()` and build the same JSON as BookingOutput and
GpuOutput (a test holds the two renderings equal).
"""

from collections import defaultdict

from django.db.models import Exists, OuterRef
from django.utils import timezone

from portal.api.serializers import (
    NODE_RUN_FIELDS,
    allocation_shown,
    booking_output_file,
    booking_signal,
    booking_window,
    gpus_shown,
    iso,
    node_run_row,
    reading_json,
)
from portal.models import Allocation, BookingDependency, MigInstance, NodeRun
from portal.models.inventory import mig_label
from portal.services.booking import fairshare
from portal.services.booking.selectors import (
    array_view,
    dependencies_by_booking,
    session_summary,
)
from portal.services.inventory import telemetry_cache
from portal.services.inventory.resources import held_by_booking

# Read to build a view of their own, not rendered as they are: the `session` summary (the
# secret is never read), `signal`, the `array` view.
_READ_FOR_VIEWS = (
    "session_state",
    "session_detail",
    "signal_name",
    "signal_before_s",
    "array_parent_id",
    "array_task_id",
    "array_spec",
)
BOOKING_FIELDS = (
    "id",
    "owner__username",
    "project__slug",
    "state",
    "state_detail",
    "gpus",
    "mig_profile",
    "gpu_model",
    "mixed_models",
    "gpu_fraction",
    "gpu_memory_mib",
    "cpus",
    "memory_mib",
    "start",
    "end",
    "duration_s",
    "qos",
    "preemptible",
    "borrowed",
    "borrowed_past",
    "command",
    "image",
    "submitted_at",
    "started_at",
    "ended_at",
    "planned_start",
    "queue_position",
    "pending_reason",
    "priority",
    "exit_code",
    "log_tail",
    "interactive",
    "workdir",
    "env",
    "restart_count",
    *_READ_FOR_VIEWS,
)
# Read with the fields: which allocations are the booking's current run, and whether it has
# dependencies to read (most pages have none: no query for them then).
BOOKING_VALUES = (*BOOKING_FIELDS, "requeued_at", "has_dependencies")


def booking_values(queryset):
    """The `.values()` rows booking_rows renders."""
    dependencies = BookingDependency.objects.filter(booking_id=OuterRef("pk"))
    return queryset.annotate(has_dependencies=Exists(dependencies)).values(*BOOKING_VALUES)


_NOT_RENDERED = set(_READ_FOR_VIEWS)
_BOOKING_TIMES = ("submitted_at", "started_at", "ended_at", "planned_start")
_ALLOCATION_FIELDS = (
    "booking_id",
    "live",
    "start",
    "end",
    "gpu__uuid",
    "gpu__index",
    "gpu__node__hostname",
    "gpu__model",
    "mig_instance_id",
    "mig_instance__uuid",
    "mig_instance__profile",
    "mig_instance__placement_start",
    "share",
    "gpu_memory_mib",
    "gpu__node_id",
    "gpu__node__cpus",
    "fraction",
)
GPU_FIELDS = (
    "id",
    "uuid",
    "node__hostname",
    "index",
    "model",
    "memory_mib",
    "mig_mode",
    "sharing",
    "retired_at",
    "pci_bus_id",
    "numa_node",
    "nvlink_peers",
)


def booking_rows(page: list[dict]) -> list[dict]:
    """BookingOutput's JSON for a page of `.values(*BOOKING_VALUES)` rows, in one more query."""
    tz = timezone.get_current_timezone()
    devices = _devices_by_booking([row["id"] for row in page], tz)
    runs = _node_runs_by_booking({row["id"]: row["restart_count"] for row in page})
    with_dependencies = [row["id"] for row in page if row["has_dependencies"]]
    dependencies = dependencies_by_booking(with_dependencies) if with_dependencies else {}
    holdings = held_by_booking(
        (
            row["id"],
            d["node_id"],
            d["row"]["node"],
            d["fraction"],
            row["cpus"],
            row["memory_mib"],
            d["node_reports"],
        )
        for row in page
        for d in devices.get(row["id"], ())
        if d["live"]
        and allocation_shown(
            live=True, start=d["start"], state=row["state"], requeued_at=row["requeued_at"]
        )
    )
    out = []
    for row in page:
        held = [
            d
            for d in devices.get(row["id"], ())
            if allocation_shown(
                live=d["live"], start=d["start"], state=row["state"], requeued_at=row["requeued_at"]
            )
        ]
        booking = {key: row[key] for key in BOOKING_FIELDS[3:] if key not in _NOT_RENDERED}
        booking.update({key: iso(row[key], tz) for key in _BOOKING_TIMES})
        booking["preemptible"] = row["preemptible"] or row["borrowed"]  # borrowed: preemptible
        start, end = booking_window(
            row["start"], row["end"], [(d["start"], d["end"]) for d in held]
        )
        booking["start"], booking["end"] = iso(start, tz), iso(end, tz)
        booking["id"] = row["id"]
        booking["gpus"] = gpus_shown(row["gpus"], row["mig_profile"])
        booking["priority"] = fairshare.priority_breakdown(row["priority"])
        booking["owner"] = row["owner__username"]
        booking["project"] = row["project__slug"]
        booking["devices"] = [d["row"] for d in held]
        booking["cuda_visible_devices"] = ",".join(d["row"]["uuid"] for d in held)
        booking["session"] = session_summary(
            booking_id=row["id"],
            interactive=row["interactive"],
            booking_state=row["state"],
            session_state=row["session_state"],
            session_detail=row["session_detail"],
        )
        booking["signal"] = booking_signal(row["signal_name"], row["signal_before_s"])
        booking["output_file"] = booking_output_file(row["id"], row["command"])
        booking["nodes"] = runs.get(row["id"], [])
        booking["array"] = array_view(
            parent_id=row["array_parent_id"], task_id=row["array_task_id"], spec=row["array_spec"]
        )
        booking["dependencies"] = dependencies.get(row["id"], [])
        booking["held"] = holdings.get(row["id"], [])
        out.append(booking)
    return out


def _node_runs_by_booking(restarts: dict[int, int]) -> dict[int, list[dict]]:
    found = defaultdict(list)
    rows = (
        NodeRun.objects.filter(booking_id__in=restarts)
        .order_by("restart", "rank", "id")
        .values("booking_id", "restart", *NODE_RUN_FIELDS)
    )
    for row in rows:
        if row["restart"] == restarts[row["booking_id"]]:
            found[row["booking_id"]].append(node_run_row(row, row["node__hostname"]))
    return found


def _devices_by_booking(ids: list[int], tz) -> dict[int, list[dict]]:
    found = defaultdict(list)
    allocations = (
        Allocation.objects.filter(booking_id__in=ids)
        .order_by("start", "id")
        .values(*_ALLOCATION_FIELDS)
    )
    for a in allocations:
        label = f"{a['gpu__node__hostname']}/gpu{a['gpu__index']}"
        if a["mig_instance_id"]:
            label = mig_label(
                hostname=a["gpu__node__hostname"],
                gpu_index=a["gpu__index"],
                profile=a["mig_instance__profile"],
                placement_start=a["mig_instance__placement_start"],
            )
            uuid = a["mig_instance__uuid"]
        else:
            uuid = a["gpu__uuid"]
        row = {
            "device": label,
            "uuid": uuid,
            "node": a["gpu__node__hostname"],
            "model": a["gpu__model"],
            "start": iso(a["start"], tz),
            "end": iso(a["end"], tz),
            "share": a["share"],
            "gpu_memory_mib": a["gpu_memory_mib"],
        }
        found[a["booking_id"]].append(
            {
                "live": a["live"],
                "start": a["start"],
                "end": a["end"],
                "row": row,
                "node_id": a["gpu__node_id"],
                "fraction": a["fraction"],
                "node_reports": a["gpu__node__cpus"] is not None,
            }
        )
    return found


def gpu_rows(page: list[dict]) -> list[dict]:
    """GpuOutput's JSON for a page of `.values(*GPU_FIELDS)` rows, in one more query and one
    multi-get of the latest readings."""
    readings = telemetry_cache.latest_by_uuid([row["uuid"] for row in page])
    tz = timezone.get_current_timezone()
    migs = defaultdict(list)
    instances = (
        MigInstance.objects.filter(gpu_id__in=[row["id"] for row in page], retired_at__isnull=True)
        .order_by("gpu_id", "uuid")
        .values("gpu_id", "id", "uuid", "profile")
    )
    for m in instances:
        migs[m.pop("gpu_id")].append(m)
    return [
        {
            "id": row["id"],
            "uuid": row["uuid"],
            "node": row["node__hostname"],
            "index": row["index"],
            "model": row["model"],
            "memory_mib": row["memory_mib"],
            "mig_mode": row["mig_mode"],
            "sharing": row["sharing"],
            "retired_at": iso(row["retired_at"], tz),
            "pci_bus_id": row["pci_bus_id"],
            "numa_node": row["numa_node"],
            "nvlink_peers": row["nvlink_peers"],
            "mig_instances": migs.get(row["id"], []),
            "reading": reading_json(readings.get(row["uuid"])),
        }
        for row in page
    ]
