"""Accounting, as Slurm's sreport: GPU-hours, energy and efficiency per project, user, GPU model
or booking over a period.

- GPU-hours: the time each allocation held its device inside the period (up to now), times the
  device's GPU-equivalents (1 for a whole GPU, slices/7 for a MIG slice); ``borrowed_gpu_hours``
  the part held by borrowed runs, past a quota's concurrency limit (elastic quotas).
- Energy (kWh): the GPU's power integrated over the held minutes, from the per-minute rollups
  (a minute's mean power for 60 s). NVML measures no power per MIG slice, so a slice is charged
  its share (slices/7) of its GPU's power. Minutes with no reading add nothing.
- Cores and memory (``cpu_hours``, ``memory_gb_hours``): the cores and GiB of host memory a
  booking holds on each node (``scheduler.node_demand``, read through
  services/inventory/resources.py) times the hours held inside the period, the same cut as
  GPU-hours; nothing on a node whose agent reports no cores and memory.
- Efficiency: mean utilization over the held minutes that have one (whole GPUs; NVML gives none
  for MIG slices), weighted by GPU-hours when grouped; peak memory used on the device.

What counts as held: a live allocation up to now; an allocation that is no longer live only
when its booking ran (it has a start time, or it was requeued and waits again), so the windows
of a reservation cancelled before it began are not charged.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from django.db.models import (
    Avg,
    FloatField,
    IntegerField,
    Max,
    OuterRef,
    Q,
    Subquery,
    Sum,
    Value,
)
from django.db.models.functions import Coalesce, Greatest, Least

from portal.models import Allocation, Booking, SampleMinute
from portal.services.access import permissions
from portal.services.inventory.resources import held_by_allocation, node_capacities
from portal.services.reporting.reservations import RESERVED_UNUSED, with_reserved_unused

GROUPS = ("project", "user", "model", "booking")
_MINUTE_S = 60.0


@dataclass
class Line:
    """One row of the report."""

    key: str
    bookings: set = field(default_factory=set)
    gpu_hours: float = 0.0
    borrowed_gpu_hours: float = 0.0
    cpu_hours: float = 0.0
    memory_gb_hours: float = 0.0
    energy_kwh: float = 0.0
    measured_gpu_hours: float = 0.0  # the GPU-hours that have a utilization reading
    utilization_weighted: float = 0.0
    peak_memory_mib: int | None = None

    def as_dict(self, group_by: str) -> dict:
        mean = (
            self.utilization_weighted / self.measured_gpu_hours if self.measured_gpu_hours else None
        )
        return {
            group_by: self.key,
            "bookings": len(self.bookings),
            "gpu_hours": round(self.gpu_hours, 3),
            "borrowed_gpu_hours": round(self.borrowed_gpu_hours, 3),
            "cpu_hours": round(self.cpu_hours, 3),
            "memory_gb_hours": round(self.memory_gb_hours, 3),
            "energy_kwh": round(self.energy_kwh, 3),
            "mean_utilization": None if mean is None else round(mean, 1),
            "peak_memory_mib": self.peak_memory_mib,
        }


def accounting_report(
    *, since: datetime, until: datetime, group_by: str, now: datetime, user=None
) -> list[dict]:
    """The report's rows, largest GPU-hours first. `user` (not staff) limits it to the projects
    the user is a member of."""
    if group_by not in GROUPS:
        raise ValueError(group_by)
    until = min(until, now)
    lines: dict[str, Line] = {}
    held = list(_held(since, until, now, user))
    on_nodes = _cores_and_memory(held)
    for row in held:
        start, end = max(row["start"], since), min(row["end"], until, now)
        if end <= start:
            continue
        key = _key(row, group_by)
        line = lines.setdefault(key, Line(key))
        duration = (end - start).total_seconds() / 3600.0
        hours = duration * row["fraction"]
        line.bookings.add(row["booking_id"])
        line.gpu_hours += hours
        cpus, memory_mib = on_nodes.get(row["id"], (0.0, 0.0))
        line.cpu_hours += cpus * duration
        line.memory_gb_hours += memory_mib / 1024.0 * duration
        if row["borrowed"]:
            line.borrowed_gpu_hours += hours
        share = row["fraction"]  # a MIG slice's or a fraction's share of its GPU's power
        line.energy_kwh += (row["power_sum"] or 0.0) * _MINUTE_S * share / 3.6e6
        # A GPU's utilization is its own only when one booking holds all of it.
        whole = row["mig_instance_id"] is None and row["gpu_memory_mib"] is None
        if row["util_avg"] is not None and whole:
            line.measured_gpu_hours += hours
            line.utilization_weighted += row["util_avg"] * hours
        if row["memory_max"] is not None:
            line.peak_memory_mib = max(line.peak_memory_mib or 0, int(row["memory_max"]))
    rows = [line.as_dict(group_by) for line in lines.values()]
    if group_by == "project":
        rows = with_reserved_unused(rows, since=since, until=until, now=now, user=user)
    rows.sort(key=lambda r: (-r["gpu_hours"], str(r[group_by])))
    return rows


def _cores_and_memory(rows: list[dict]) -> dict[int, tuple[float, float]]:
    """(cores, memory MiB) each allocation held; a booking's rows that began together are what
    it held at once (a requeued booking's later rows are another hold)."""
    nodes = {row["gpu__node_id"] for row in rows}
    return held_by_allocation(
        (
            (
                row["id"],
                (row["booking_id"], row["start"]),
                row["gpu__node_id"],
                row["fraction"],
                row["booking__cpus"],
                row["booking__memory_mib"],
            )
            for row in rows
        ),
        node_capacities(nodes),
    )


def _key(row: dict, group_by: str) -> str:
    return str(
        {
            "project": row["booking__project__slug"],
            "user": row["booking__owner__username"],
            "model": row["gpu__model"],
            "booking": row["booking_id"],
        }[group_by]
    )


def _held(since: datetime, until: datetime, now: datetime, user):
    ran = (
        Q(live=True)
        | Q(booking__started_at__isnull=False)
        | Q(booking__state=Booking.State.PENDING)
    )
    allocations = Allocation.objects.filter(ran, start__lt=until, end__gt=since)
    if user is not None:
        match = permissions.visible_filter(
            user, "accounting.view", owner_field=None, project_field="booking__project_id"
        )
        if match is not None:
            allocations = allocations.filter(match)
    window_start = Greatest(OuterRef("start"), Value(since))
    window_end = Least(OuterRef("end"), Value(until))
    on_gpu = SampleMinute.objects.filter(
        uuid=OuterRef("gpu__uuid"), minute__gte=window_start, minute__lt=window_end
    ).values("uuid")
    on_device = SampleMinute.objects.filter(
        uuid=Coalesce(OuterRef("mig_instance__uuid"), OuterRef("gpu__uuid")),
        minute__gte=window_start,
        minute__lt=window_end,
    ).values("uuid")
    return (
        allocations.annotate(
            power_sum=Subquery(
                on_gpu.annotate(v=Sum("power_w_avg")).values("v"), output_field=FloatField()
            ),
            util_avg=Subquery(
                on_gpu.annotate(v=Avg("utilization_gpu_avg")).values("v"),
                output_field=FloatField(),
            ),
            memory_max=Subquery(
                on_device.annotate(v=Max("memory_used_mib_max")).values("v"),
                output_field=IntegerField(),
            ),
        )
        .values(
            "id",
            "booking_id",
            "gpu__node_id",
            "booking__cpus",
            "booking__memory_mib",
            "start",
            "end",
            "fraction",
            "borrowed",
            "mig_instance_id",
            "gpu_memory_mib",
            "power_sum",
            "util_avg",
            "memory_max",
            "gpu__model",
            "booking__project__slug",
            "booking__owner__username",
        )
        .order_by("id")
    )


def report_columns(group_by: str) -> list[str]:
    """The names of a report row's fields, in order (a CSV header even when no row has usage)."""
    columns = list(Line(key="").as_dict(group_by))
    return columns + [RESERVED_UNUSED] if group_by == "project" else columns


def report_totals(rows: list[dict]) -> dict:
    """The report's sums (GPU-hours, core- and memory-hours, energy, bookings)."""
    return {
        "gpu_hours": round(sum(r["gpu_hours"] for r in rows), 3),
        "borrowed_gpu_hours": round(sum(r["borrowed_gpu_hours"] for r in rows), 3),
        "cpu_hours": round(sum(r["cpu_hours"] for r in rows), 3),
        "memory_gb_hours": round(sum(r["memory_gb_hours"] for r in rows), 3),
        "energy_kwh": round(sum(r["energy_kwh"] for r in rows), 3),
        "bookings": sum(r["bookings"] for r in rows),
    }
