"""Quota selectors: the limits a user has in a project, and what they use now.

``quota_positions`` is the one reader of a request's quota position, for every path (the
allocator's snapshot, reservations, extend, admission, the estimate and the budget scan);
``scheduler.position_refusal`` is the one check of it.
"""

from collections.abc import Hashable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db.models import Count, ExpressionWrapper, F, FloatField, Q, Sum, Value
from django.db.models.functions import Greatest, Least

import scheduler
from portal.models import Allocation, Project, Quota
from portal.services.core.clock import EpochSeconds, to_epoch
from portal.services.inventory.resources import held_on_nodes, node_capacities
from scheduler.quota import Ledger

DEFAULT_BUDGET_PERIOD_DAYS = 30
_FIELDS = (
    "max_gpus",
    "gpu_hours_budget",
    "budget_period_days",
    "max_duration_s",
    "allowed_models",
    "allowed_qos",
    "borrowing",
    "max_borrow_gpus",
    "max_cpus",
    "max_memory_mib",
)


@dataclass(frozen=True)
class EffectiveQuota:
    """A user's limits in a project: the user's override where set, else the project's."""

    max_gpus: float | None = None
    gpu_hours_budget: float | None = None
    budget_period_days: int = DEFAULT_BUDGET_PERIOD_DAYS
    max_duration_s: int | None = None
    allowed_models: tuple[str, ...] = ()
    allowed_qos: tuple[str, ...] = ()
    shares: float = 1.0
    borrowing: bool = False  # with no row saying, the site's QUOTA_BORROWING (``_merge``)
    max_borrow_gpus: float | None = None
    max_cpus: int | None = None
    max_memory_mib: int | None = None


@dataclass(frozen=True)
class Usage:
    """GPUs held right now and GPU-hours used in the rolling budget period."""

    gpus_in_use: float
    gpu_hours_used: float


def scheduler_quota(quota: EffectiveQuota, *, gpu_hours_used: float = 0.0) -> scheduler.Quota:
    """The limits as the scheduler's quota rule takes them (scheduler.quota_refusal)."""
    return scheduler.Quota(
        max_gpus=quota.max_gpus,
        gpu_hours_budget=quota.gpu_hours_budget,
        gpu_hours_used=gpu_hours_used,
        borrowing=quota.borrowing,
        max_borrow_gpus=quota.max_borrow_gpus,
        max_cpus=quota.max_cpus,
        max_memory_mib=quota.max_memory_mib,
    )


@dataclass(frozen=True)
class QuotaAsk:
    """Whose quota position to read: a user in a project, and where the request would hold
    devices (``window``; None for a queued one, whose window the allocator finds) less one
    booking's own use (``exclude_booking``: the booking being extended)."""

    project_id: int
    user_id: int
    window: tuple[datetime, datetime] | None = None
    exclude_booking: int | None = None


@dataclass(frozen=True)
class QuotaPosition:
    """A request's quota position: the user-in-project and the project, each with its limits,
    GPU-hours used in its budget period and the most GPU-equivalents held over the window."""

    user_limits: EffectiveQuota
    project_limits: EffectiveQuota
    user: scheduler.QuotaSide
    project: scheduler.QuotaSide

    @property
    def sides(self) -> tuple[scheduler.QuotaSide, scheduler.QuotaSide]:
        return (self.user, self.project)


def quota_positions(
    *, now: datetime, asks: Mapping[Hashable, QuotaAsk], use: bool = True
) -> dict[Hashable, QuotaPosition]:
    """Quota positions of many requests in a constant number of queries: one for the limits,
    one per distinct budget period for GPU-hours used, one for what is held over the windows.
    With ``use=False`` only the limits are read (nothing used or held)."""
    pairs = {(a.project_id, a.user_id) for a in asks.values()}
    limits = quotas_effective_many(pairs=pairs)
    used: dict[tuple, float] = {}
    if use:
        periods = {q.budget_period_days for q in limits.values() if q.gpu_hours_budget is not None}
        used = usage_gpu_hours_many(project_ids={p for p, _ in pairs}, now=now, periods=periods)
    windowed = {key: ask for key, ask in asks.items() if use and ask.window is not None}
    held = _held_many(windowed)
    hosted = {
        key: ask
        for key, ask in windowed.items()
        if _host_limited(limits[(ask.project_id, ask.user_id)])
        or _host_limited(limits[(ask.project_id, None)])
    }
    host_held = _host_held_many(hosted)
    out = {}
    for key, ask in asks.items():
        mine, theirs = limits[(ask.project_id, ask.user_id)], limits[(ask.project_id, None)]
        user_held, project_held = held.get(key, (0.0, 0.0))
        user_host, project_host = host_held.get(key, ((0.0, 0.0), (0.0, 0.0)))
        out[key] = QuotaPosition(
            user_limits=mine,
            project_limits=theirs,
            user=_side("user", mine, used, (ask.project_id, ask.user_id), user_held, user_host),
            project=_side(
                "project", theirs, used, (ask.project_id, None), project_held, project_host
            ),
        )
    return out


def _host_limited(limits: EffectiveQuota) -> bool:
    return limits.max_cpus is not None or limits.max_memory_mib is not None


def quota_position(
    *,
    project: Project,
    user,
    now: datetime,
    window: tuple[datetime, datetime] | None = None,
    exclude_booking: int | None = None,
    use: bool = True,
) -> QuotaPosition:
    """The quota position of one request (``quota_positions`` with one key)."""
    ask = QuotaAsk(project.pk, user.pk, window, exclude_booking)
    return quota_positions(now=now, asks={None: ask}, use=use)[None]


def _side(
    scope: str,
    limits: EffectiveQuota,
    used: dict,
    key: tuple,
    held: float,
    host_held: tuple[float, float] = (0.0, 0.0),
):
    hours = 0.0
    if limits.gpu_hours_budget is not None:
        hours = used.get((limits.budget_period_days, *key), 0.0)
    quota = scheduler_quota(limits, gpu_hours_used=hours)
    return scheduler.QuotaSide(scope, quota, held, host_held)


def _held_many(asks: Mapping[Hashable, QuotaAsk]) -> dict[Hashable, tuple[float, float]]:
    """Most GPU-equivalents held at once by live allocations over each ask's window, by the
    user in the project and by the project (the allocator's ledgers measure it), in one query.
    Borrowed allocations count against no concurrency limit, as in the allocator."""
    if not asks:
        return {}
    start = min(ask.window[0] for ask in asks.values())
    end = max(ask.window[1] for ask in asks.values())
    rows = Allocation.objects.filter(
        booking__project_id__in={ask.project_id for ask in asks.values()},
        live=True,
        borrowed=False,
        start__lt=end,
        end__gt=start,
    ).values_list(
        "booking__project_id", "booking__owner_id", "booking_id", "start", "end", "fraction"
    )
    rows = list(rows)
    out = {}
    for key, ask in asks.items():
        lo, hi = to_epoch(ask.window[0]), to_epoch(ask.window[1])
        mine, theirs = Ledger("user", scheduler.Quota()), Ledger("project", scheduler.Quota())
        for project_id, owner_id, booking_id, a_start, a_end, fraction in rows:
            if project_id != ask.project_id or booking_id == ask.exclude_booking:
                continue
            span = (to_epoch(a_start), to_epoch(a_end), fraction, str(booking_id))
            theirs.add(*span)
            if owner_id == ask.user_id:
                mine.add(*span)
        # Unrounded: a slice is a seventh, and the check compares at the limit itself.
        out[key] = (mine.peak(lo, hi), theirs.peak(lo, hi))
    return out


def _host_held_many(
    asks: Mapping[Hashable, QuotaAsk],
) -> dict[Hashable, tuple[tuple[float, float], tuple[float, float]]]:
    """Most cores and most memory MiB held at once by live allocations over each ask's window
    (``resources.held_on_nodes``, each booking over its span), by the user in the project and
    by the project: ((user cores, user memory), (project cores, project memory)). Borrowed
    allocations count too: these limits are never borrowed past (``quota.HostLedger``)."""
    if not asks:
        return {}
    start = min(ask.window[0] for ask in asks.values())
    end = max(ask.window[1] for ask in asks.values())
    capacities = node_capacities()
    rows = list(
        Allocation.objects.filter(
            booking__project_id__in={ask.project_id for ask in asks.values()},
            live=True,
            start__lt=end,
            end__gt=start,
            gpu__node_id__in=list(capacities),
        ).values_list(
            "booking_id",
            "gpu__node_id",
            "fraction",
            "booking__cpus",
            "booking__memory_mib",
            "booking__project_id",
            "booking__owner_id",
            "start",
            "end",
        )
    )
    held = held_on_nodes((row[:5] for row in rows), capacities)
    whose = {row[0]: (row[5], row[6]) for row in rows}
    spans: dict[int, tuple[float, float]] = {}
    for row in rows:
        first, last = spans.get(row[0], (to_epoch(row[7]), to_epoch(row[8])))
        spans[row[0]] = (min(first, to_epoch(row[7])), max(last, to_epoch(row[8])))
    out = {}
    for key, ask in asks.items():
        lo, hi = to_epoch(ask.window[0]), to_epoch(ask.window[1])
        ledgers = [[Ledger("", scheduler.Quota()) for _ in range(2)] for _ in range(2)]
        for (booking_id, _), demand in held.items():
            project_id, owner_id = whose[booking_id]
            if project_id != ask.project_id or booking_id == ask.exclude_booking:
                continue
            for side, counts in enumerate(ledgers):
                if side == 0 and owner_id != ask.user_id:
                    continue
                for index, ledger in enumerate(counts):
                    ledger.add(*spans[booking_id], demand[index], str(booking_id))
        mine, theirs = ((c.peak(lo, hi), m.peak(lo, hi)) for c, m in ledgers)
        out[key] = (mine, theirs)
    return out


def quotas_effective_many(
    *, pairs: set[tuple[int, int]]
) -> dict[tuple[int, int | None], EffectiveQuota]:
    """Limits of many (project_id, user_id) pairs and of their projects, in one query.

    Keys are the pairs, and (project_id, None) for each project's own limits.
    """
    project_ids = {project_id for project_id, _ in pairs}
    rows = {(q.project_id, q.user_id): q for q in Quota.objects.filter(project_id__in=project_ids)}
    out: dict[tuple[int, int | None], EffectiveQuota] = {
        (project_id, None): _merge([rows.get((project_id, None))]) for project_id in project_ids
    }
    for project_id, user_id in pairs:
        out[(project_id, user_id)] = _merge(
            [rows.get((project_id, user_id)), rows.get((project_id, None))]
        )
    return out


def usage_gpu_hours_many(
    *, project_ids: set[int], now: datetime, periods: set[int]
) -> dict[tuple, float]:
    """GPU-hours used in each rolling period, per (period_days, project_id, user_id) and per
    (period_days, project_id, None), summed in the database: one query per distinct period."""
    out: dict[tuple, float] = {}
    for days in periods:
        since = now - timedelta(days=days)
        rows = (
            Allocation.objects.filter(
                booking__project_id__in=project_ids, start__lt=now, end__gt=since
            )
            .values("booking__project_id", "booking__owner_id")
            .annotate(
                seconds=Sum(
                    ExpressionWrapper(
                        F("fraction") * EpochSeconds(Least(F("end"), Value(now)))
                        - F("fraction") * EpochSeconds(Greatest(F("start"), Value(since))),
                        output_field=FloatField(),
                    )
                )
            )
        )
        for row in rows:
            project_id, hours = row["booking__project_id"], (row["seconds"] or 0.0) / 3600
            out[(days, project_id, row["booking__owner_id"])] = round(hours, 4)
            key = (days, project_id, None)
            out[key] = round(out.get(key, 0.0) + hours, 4)
    return out


def _merge(rows: list[Quota | None]) -> EffectiveQuota:
    values: dict = {}
    for name in _FIELDS:
        for row in rows:
            value = getattr(row, name, None) if row else None
            if value not in (None, []):
                values[name] = tuple(value) if isinstance(value, list) else value
                break
    values.setdefault("borrowing", settings.QUOTA_BORROWING)
    project_row = rows[-1]
    if project_row and project_row.fairshare_shares is not None:
        values["shares"] = project_row.fairshare_shares
    return EffectiveQuota(**values)


def usage_current(*, project: Project, user=None, now: datetime, period_days: int) -> Usage:
    """Usage of a project (or of one user in it) at `now`: GPU-equivalents held now and
    GPU-hours used in the period, read as the quota position reads them."""
    used = usage_gpu_hours_many(project_ids={project.pk}, now=now, periods={period_days})
    user_id = user.pk if user is not None else None
    held = _held_many({None: QuotaAsk(project.pk, user_id or 0, (now, now + _INSTANT))})
    mine, theirs = held[None]
    return Usage(
        gpus_in_use=round(mine if user is not None else theirs, 4),
        gpu_hours_used=used.get((period_days, project.pk, user_id), 0.0),
    )


_INSTANT = timedelta(microseconds=1)


def devices_held_now(*, project: Project, user=None, now: datetime) -> tuple[int, int]:
    """Whole GPUs and MIG slices (instances) a project, or one user in it, holds at `now`: the
    devices behind `usage_current`'s GPU-equivalents, counted as people count them."""
    rows = Allocation.objects.filter(
        booking__project=project, live=True, start__lt=now + _INSTANT, end__gt=now
    )
    if user is not None:
        rows = rows.filter(booking__owner=user)
    counts = rows.aggregate(
        whole=Count("id", filter=Q(mig_instance__isnull=True)),
        slices=Count("id", filter=Q(mig_instance__isnull=False)),
    )
    return counts["whole"], counts["slices"]


def quota_overview(*, user, now: datetime) -> list[dict]:
    """The user's limits and current use in each of their projects (GET me/quota/)."""
    rows = []
    for membership in user.memberships.select_related("project").order_by("project__slug"):
        project = membership.project
        quota = quota_position(project=project, user=user, now=now, use=False).user_limits
        mine = usage_current(
            project=project, user=user, now=now, period_days=quota.budget_period_days
        )
        theirs = usage_current(project=project, now=now, period_days=quota.budget_period_days)
        rows.append(
            {
                "project": project.slug,
                "role": membership.role,
                "limits": {
                    "max_gpus": quota.max_gpus,
                    "gpu_hours_budget": quota.gpu_hours_budget,
                    "budget_period_days": quota.budget_period_days,
                    "max_duration_s": quota.max_duration_s,
                    "allowed_models": list(quota.allowed_models),
                    "allowed_qos": list(quota.allowed_qos),
                    "fairshare_shares": quota.shares,
                    "borrowing": quota.borrowing,
                    "max_borrow_gpus": quota.max_borrow_gpus,
                    "max_cpus": quota.max_cpus,
                    "max_memory_mib": quota.max_memory_mib,
                },
                "usage": {"gpus_in_use": mine.gpus_in_use, "gpu_hours_used": mine.gpu_hours_used},
                "project_usage": {
                    "gpus_in_use": theirs.gpus_in_use,
                    "gpu_hours_used": theirs.gpu_hours_used,
                },
            }
        )
    return rows
