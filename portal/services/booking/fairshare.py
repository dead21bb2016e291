"""Fair-share usage per project: allocated GPU-seconds, or measured use (``fairshare_charge``).

Under "measured" or "blend", each allocation's mean utilization is measured once, when it ends,
from the minute rollups of its device, and kept on the allocation (allocations that ended while
the charge was "allocated" were not measured, and are charged in full). Running allocations are
measured at pass time from the rollups since their start, cached for
``FAIRSHARE_LIVE_UTILIZATION_CACHE_S`` (a pass every few seconds need not re-read hours of
minutes). With the default "allocated" charge nothing here
reads telemetry.

An allocation on a node that reports cores and memory is charged by its dominant resource
(``scheduler.billing_equivalents``): the largest of its GPU, core and memory shares of the
site's totals, in GPU-equivalents, where it would otherwise be charged its GPU-equivalents.
"""

from datetime import datetime, timedelta

from django.conf import settings
from django.core.cache import cache
from django.db import transaction
from django.db.models import Avg, F, OuterRef, Q, Subquery
from django.db.models.functions import Coalesce, Least

import scheduler
from portal.models import Allocation, FairshareUsage, SampleMinute
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
    # A fraction of a shared GPU is not measured on its own (the GPU's utilization is all its
    # tenants'): like a MIG slice it is charged in full.
    ended = ended.filter(gpu_memory_mib__isnull=True)
    for pk, value in allocations_utilization(allocations=ended, now=now).items():
        if value is not None:
            Allocation.objects.filter(pk=pk).update(mean_utilization=value)


def project_usage(*, now: datetime, policy: scheduler.Policy) -> dict[str, float]:
    """Decayed fair-share usage per project slug, charged as ``policy.fairshare_charge`` says.

    The running totals (kept by ``fairshare_fold``, each pass) decayed to ``now``, plus the use
    not yet folded into them; before the first pass under this policy, from the history.
    """
    totals = _totals(policy)
    if totals is None:
        return _usage_from_history(now=now, policy=policy)
    usage: dict[str, float] = {}
    for (slug, _user), (value, as_of) in totals.items():
        usage[slug] = usage.get(slug, 0.0) + _decayed(value, as_of, now, policy)
    since = min(as_of for _, as_of in totals.values())
    for (slug, _user), value in _unfolded(now, policy, since)[0].items():
        usage[slug] = usage.get(slug, 0.0) + value
    return usage


def fairshare_fold(*, now: datetime, policy: scheduler.Policy) -> int:
    """Bring the running totals to ``now``: decay them and add each allocation's use since the
    last fold. Run by the allocation pass (one at a time, under its lock), before its snapshot.
    Returns how many allocations it read.

    Every total is kept as of the same time (the last fold), and every allocation that started
    before it was counted up to then, so an allocation still running needs no mark; one that
    ended is marked counted to its end (``charged_until``) and is not read again. So a fold
    writes the totals and the allocations that ended since the last one.
    """
    with transaction.atomic():
        rows = {(r.project_id, r.user_id): r for r in FairshareUsage.objects.select_for_update()}
        if not _kept_under(rows.values(), policy):
            return _rebuild(now, policy)
        since = min(to_epoch(r.as_of) for r in rows.values())
        added, counted = _unfolded(now, policy, since, by_id=True)
        totals = {
            key: _decayed(row.gpu_seconds, to_epoch(row.as_of), now, policy)
            for key, row in rows.items()
        }
        for key, value in added.items():
            totals[key] = totals.get(key, 0.0) + value
        # One upsert for every total (bulk_update's CASE per row cost more than the history).
        FairshareUsage.objects.bulk_create(
            [_row(key, value, now, policy) for key, value in totals.items()],
            update_conflicts=True,
            unique_fields=["project", "user"],
            update_fields=["gpu_seconds", "as_of"],
        )
        _mark_counted(counted, now)
    return len(counted)


def _kept_under(rows, policy: scheduler.Policy) -> bool:
    """Whether there are totals and all were kept under this half-life and charge."""
    rows = list(rows)
    return bool(rows) and all(
        r.half_life_s == policy.fairshare_half_life_s and r.charge == policy.fairshare_charge
        for r in rows
    )


def _totals(policy: scheduler.Policy) -> dict | None:
    """{(project slug, user id): (GPU-seconds, as_of epoch)}, or None when the totals were not
    kept under this policy (none yet, another half-life or charge)."""
    rows = list(FairshareUsage.objects.select_related("project"))
    if not _kept_under(rows, policy):
        return None
    return {(r.project.slug, r.user_id): (r.gpu_seconds, to_epoch(r.as_of)) for r in rows}


def _decayed(value: float, as_of: float, now: datetime, policy: scheduler.Policy) -> float:
    elapsed = max(0.0, to_epoch(now) - as_of)
    return scheduler.carry_usage({"": value}, elapsed, policy.fairshare_half_life_s)[""]


def _charging(now: datetime):
    """Allocations with use not yet in the totals (the partial index portal_alloc_uncharged)."""
    pending = Q(charged_until__isnull=True) | Q(charged_until__lt=F("end"))
    return Allocation.objects.filter(pending, start__lt=now)


def _unfolded(now: datetime, policy: scheduler.Policy, since: float, *, by_id: bool = False):
    """The use of each (project, user) since the last fold at ``since`` (or since its
    ``charged_until``), decayed to ``now``, keyed by project slug (or id, ``by_id``); and
    {allocation id: counted up to} for those fairshare_fold must mark."""
    project = "booking__project_id" if by_id else "booking__project__slug"
    rows = _charging(now).annotate(
        start_ts=EpochSeconds("start"),
        end_ts=EpochSeconds("end"),
        counted_ts=EpochSeconds("charged_until"),
    )
    fields = ("pk", project, "booking__owner_id", "start_ts", "end_ts", "counted_ts", "fraction")
    rows = list(rows.values_list(*fields, "mean_utilization", *_HELD))
    dominant = _dominant_equivalents([(r[0], r[3], r[6], *r[8:]) for r in rows], policy)
    live = None if policy.fairshare_charge == "allocated" else _live_utilization(now)
    at = to_epoch(now)
    added: dict[tuple, float] = {}
    counted: dict[int, float] = {}
    for pk, proj, user, start, end, done, fraction, stored, *_ in rows:
        begin, until = max(start, since if done is None else done), min(end, at)
        if until < at or done is not None:  # ended; or marked once, so kept marked
            counted[pk] = until
        if until <= begin:
            continue
        charged = dominant.get(pk, fraction)
        if live is not None:
            utilization = live.get(pk) if stored is None else stored
            charged = fraction * scheduler.charged_fraction(utilization, policy)
        part = scheduler.decay_usage(
            [("", begin, until, charged)], at, policy.fairshare_half_life_s
        )
        added[(proj, user)] = added.get((proj, user), 0.0) + part.get("", 0.0)
    return added, counted


# What an allocation's booking asked on its node, after its GPU-equivalents.
_HELD = ("booking_id", "gpu__node_id", "booking__cpus", "booking__memory_mib")


def _dominant_equivalents(rows: list[tuple], policy: scheduler.Policy) -> dict[int, float]:
    """GPU-equivalents fair share charges each allocation on a node that reports cores and
    memory: the largest of its GPU, core and memory shares of the site's totals (the sum of
    those nodes), ``scheduler.billing_equivalents``. Rows: (allocation id, start, fraction,
    booking id, node id, cpus, memory_mib). A site whose nodes report none: nothing here,
    every allocation charged its GPU-equivalents as before."""
    # Imported here: resources reads the policy from the snapshot, which imports this module.
    from portal.services.inventory.resources import held_by_allocation, node_capacities

    capacities = node_capacities()
    if not capacities:
        return {}
    site = scheduler.NodeResources(
        sum(c.cpus for c in capacities.values()),
        sum(c.memory_mib for c in capacities.values()),
        sum(c.gpus for c in capacities.values()),
    )
    fractions = {row[0]: row[2] for row in rows}
    held = held_by_allocation(
        (
            (pk, (booking, start), node, fraction, cpus, memory)
            for pk, start, fraction, booking, node, cpus, memory in rows
        ),
        capacities,
        policy,
    )
    return {
        pk: scheduler.billing_equivalents(fractions[pk], cpus, memory_mib, site)
        for pk, (cpus, memory_mib) in held.items()
    }


def _mark_counted(counted: dict[int, float], now: datetime) -> None:
    """These allocations counted up to min(their end, now): two statements, however many."""
    at = to_epoch(now)
    running = [pk for pk, until in counted.items() if until >= at]
    ended = [pk for pk, until in counted.items() if until < at]
    Allocation.objects.filter(pk__in=running).update(charged_until=now)
    Allocation.objects.filter(pk__in=ended).update(charged_until=F("end"))


def _row(key: tuple, value: float, now: datetime, policy: scheduler.Policy) -> FairshareUsage:
    return FairshareUsage(
        project_id=key[0],
        user_id=key[1],
        gpu_seconds=value,
        as_of=now,
        half_life_s=policy.fairshare_half_life_s,
        charge=policy.fairshare_charge,
    )


def _rebuild(now: datetime, policy: scheduler.Policy) -> int:
    """The totals from the history (four half-lives), every allocation counted up to now."""
    by_user = _usage_from_history(now=now, policy=policy, key="booking__owner_id", by_id=True)
    FairshareUsage.objects.all().delete()
    FairshareUsage.objects.bulk_create(
        _row(key, value, now, policy) for key, value in by_user.items()
    )
    # Ended ones counted to their end; running ones (start before now) counted to now, the
    # totals' time, with no mark.
    Allocation.objects.filter(start__lt=now, end__lte=now).exclude(charged_until=F("end")).update(
        charged_until=F("end")
    )
    Allocation.objects.filter(start__lt=now, end__gt=now).exclude(charged_until=None).update(
        charged_until=None
    )
    return len(by_user)


def _usage_from_history(
    *, now: datetime, policy: scheduler.Policy, key: str | None = None, by_id: bool = False
) -> dict:
    """Decayed use from four half-lives of allocations: per project slug, or per (project id,
    ``key``) when given."""
    half_life = policy.fairshare_half_life_s
    since = now - timedelta(seconds=4 * half_life)
    window = Allocation.objects.filter(start__lt=now, end__gt=since)
    rows = window.annotate(start_ts=EpochSeconds("start"), end_ts=EpochSeconds("end"))
    project = "booking__project_id" if by_id else "booking__project__slug"
    live = None if policy.fairshare_charge == "allocated" else _live_utilization(now)
    records = []
    rows = list(
        rows.values_list(
            "pk", project, key or "pk", "start_ts", "end_ts", "fraction", "mean_utilization", *_HELD
        )
    )
    dominant = _dominant_equivalents([(r[0], r[3], r[5], *r[7:]) for r in rows], policy)
    for pk, proj, who, start, end, fraction, stored, *_ in rows:
        charged = dominant.get(pk, fraction)
        if live is not None:
            utilization = live.get(pk) if stored is None else stored
            charged *= scheduler.charged_fraction(utilization, policy)
        records.append(((proj, who) if key else proj, start, end, charged))
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
