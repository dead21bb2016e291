"""Fair-share usage per project: allocated GPU-seconds, or measured use (``fairshare_charge``).

Under "measured" or "blend", each allocation's mean utilization is measured once, when it ends,
from the minute rollups of its device, and kept on the allocation (allocations that ended while
the charge was "allocated" were not measured, and are charged in full). Running allocations are
measured at pass time from the rollups since their start, cached for
``FAIRSHARE_LIVE_UTILIZATION_CACHE_S`` (a pass every few seconds need not re-read hours of
minutes). With the default "allocated" charge nothing here
reads telemetry.
"""

from datetime import datetime, timedelta

from django.conf import settings
from django.core.cache import cache
from django.db.models import Avg, OuterRef, Subquery
from django.db.models.functions import Coalesce, Least

import scheduler
from portal.models import Allocation, SampleMinute
from portal.services.core.clock import EpochSeconds, to_epoch

_LIVE_KEY = "fairshare:live-utilization"


def allocations_utilization(*, allocations, now: datetime) -> dict[int, float | None]:
    """Mean utilization (0-1) of each allocation's device from its start to min(end, now).

    None where nothing was measured: no rollup in the window, or a MIG slice (NVML reports no
    utilization for those).
    """
    minutes = SampleMinute.objects.filter(
        uuid=OuterRef("device_uuid"),
        minute__gte=OuterRef("start"),
        minute__lt=Least(OuterRef("end"), now),
        utilization_gpu_avg__isnull=False,
    )
    mean = minutes.order_by().values("uuid").annotate(mean=Avg("utilization_gpu_avg"))
    rows = (
        allocations.annotate(device_uuid=Coalesce("mig_instance__uuid", "gpu__uuid"))
        .annotate(mean=Subquery(mean.values("mean")[:1]))
        .values_list("pk", "mean")
    )
    return {pk: None if value is None else value / 100.0 for pk, value in rows}


def allocations_measure(*, booking_id: int, now: datetime) -> None:
    """Keep the mean utilization on a booking's ended allocations (called as the booking ends).

    Only while fair share charges measured use: under "allocated" nothing reads it, and a pass
    that preempts or ends dozens of bookings should not pay a telemetry scan for each.
    """
    if _charge() == "allocated":
        return
    ended = Allocation.objects.filter(booking_id=booking_id, live=False, start__lt=now)
    for pk, value in allocations_utilization(allocations=ended, now=now).items():
        if value is not None:
            Allocation.objects.filter(pk=pk).update(mean_utilization=value)


def project_usage(*, now: datetime, policy: scheduler.Policy) -> dict[str, float]:
    """Decayed fair-share usage per project slug, charged as ``policy.fairshare_charge`` says."""
    half_life = policy.fairshare_half_life_s
    since = now - timedelta(seconds=4 * half_life)
    window = Allocation.objects.filter(start__lt=now, end__gt=since)
    rows = window.annotate(start_ts=EpochSeconds("start"), end_ts=EpochSeconds("end"))
    if policy.fairshare_charge == "allocated":
        records = rows.values_list("booking__project__slug", "start_ts", "end_ts", "fraction")
        return scheduler.decay_usage(records, to_epoch(now), half_life)
    live = _live_utilization(now)
    records = []
    for pk, project, start, end, fraction, stored in rows.values_list(
        "pk", "booking__project__slug", "start_ts", "end_ts", "fraction", "mean_utilization"
    ):
        utilization = live.get(pk) if stored is None else stored
        charged = fraction * scheduler.charged_fraction(utilization, policy)
        records.append((project, start, end, charged))
    return scheduler.decay_usage(records, to_epoch(now), half_life)


def _live_utilization(now: datetime) -> dict[int, float | None]:
    cached = cache.get(_LIVE_KEY)
    if cached is not None:
        return cached
    live = Allocation.objects.filter(live=True, start__lt=now)
    measured = allocations_utilization(allocations=live, now=now)
    cache.set(_LIVE_KEY, measured, settings.FAIRSHARE_LIVE_UTILIZATION_CACHE_S)
    return measured


def priority_breakdown(priority: dict | None) -> dict | None:
    """A stored priority with what its fair-share factor charges (``fairshare_charge``)."""
    if priority is None:
        return None
    return {**priority, "fairshare_charge": _charge()}


def _charge() -> str:
    # The setting as given, else the policy's own default: no Policy is built for each row.
    return settings.SCHEDULER_POLICY.get("fairshare_charge", scheduler.Policy.fairshare_charge)


def charge_description(policy: scheduler.Policy) -> str:
    """One line saying what fair share charges, for the priority breakdown."""
    floor = f"{policy.fairshare_idle_floor:.0%}"
    if policy.fairshare_charge == "measured":
        return f"measured use (allocated × mean utilization, at least {floor})"
    if policy.fairshare_charge == "blend":
        return (
            f"blend: {policy.fairshare_blend:.0%} allocated, the rest measured use"
            f" (allocated × mean utilization, at least {floor})"
        )
    return "allocated GPU-seconds"
