"""Quota selectors: the limits a user has in a project, and what they use now."""

from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db.models import ExpressionWrapper, F, FloatField, Func, Q, Sum, Value
from django.db.models.functions import Greatest, Least

from portal.models import Allocation, Project, Quota

DEFAULT_BUDGET_PERIOD_DAYS = 30
_FIELDS = (
    "max_gpus",
    "gpu_hours_budget",
    "budget_period_days",
    "max_duration_s",
    "allowed_models",
    "allowed_qos",
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


@dataclass(frozen=True)
class Usage:
    """GPUs held right now and GPU-hours used in the rolling budget period."""

    gpus_in_use: float
    gpu_hours_used: float


def scheduler_quota(quota: EffectiveQuota, *, gpu_hours_used: float = 0.0):
    """The limits as the scheduler's quota rule takes them (scheduler.quota_refusal)."""
    import scheduler

    return scheduler.Quota(
        max_gpus=quota.max_gpus,
        gpu_hours_budget=quota.gpu_hours_budget,
        gpu_hours_used=gpu_hours_used,
    )


def quota_project(*, project: Project) -> EffectiveQuota:
    """The project's own limits (no user override)."""
    row = Quota.objects.filter(project=project, user__isnull=True).first()
    return _merge([row])


def quota_effective(*, project: Project, user) -> EffectiveQuota:
    """Limits for `user` in `project`: the override row field by field, then the project row."""
    rows = {
        q.user_id: q
        for q in Quota.objects.filter(Q(user__isnull=True) | Q(user=user), project=project)
    }
    return _merge([rows.get(user.pk), rows.get(None)])


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


class EpochSeconds(Func):
    """Seconds since the epoch of a timestamp (PostgreSQL and SQLite)."""

    output_field = FloatField()

    def as_postgresql(self, compiler, connection, **extra):
        # EXTRACT gives numeric, which the driver would build a Decimal from for every row.
        return self.as_sql(
            compiler, connection, template="EXTRACT(EPOCH FROM %(expressions)s)::float8"
        )

    def as_sqlite(self, compiler, connection, **extra):
        # julianday() counts days from 4714 BC; the Unix epoch is Julian day 2440587.5. NULL in,
        # NULL out, as on PostgreSQL.
        return self.as_sql(
            compiler,
            connection,
            template="((julianday(%(expressions)s) - 2440587.5) * 86400.0)",
        )


def _merge(rows: list[Quota | None]) -> EffectiveQuota:
    values: dict = {}
    for name in _FIELDS:
        for row in rows:
            value = getattr(row, name, None) if row else None
            if value not in (None, []):
                values[name] = tuple(value) if isinstance(value, list) else value
                break
    project_row = rows[-1]
    if project_row and project_row.fairshare_shares is not None:
        values["shares"] = project_row.fairshare_shares
    return EffectiveQuota(**values)


def usage_current(*, project: Project, user=None, now: datetime, period_days: int) -> Usage:
    """Usage of a project (or of one user in it) at `now`."""
    since = now - timedelta(days=period_days)
    allocations = Allocation.objects.filter(booking__project=project, start__lt=now, end__gt=since)
    if user is not None:
        allocations = allocations.filter(booking__owner=user)
    in_use = 0.0
    gpu_seconds = 0.0
    for start, end, fraction, live in allocations.values_list("start", "end", "fraction", "live"):
        if live and start <= now < end:
            in_use += fraction
        gpu_seconds += fraction * (min(end, now) - max(start, since)).total_seconds()
    return Usage(gpus_in_use=round(in_use, 4), gpu_hours_used=round(gpu_seconds / 3600, 4))


def peak_use_in_window(*, project: Project, user=None, start: datetime, end: datetime) -> float:
    """Most GPU-equivalents held at any moment of [start, end) by live allocations."""
    allocations = Allocation.objects.filter(
        booking__project=project, live=True, start__lt=end, end__gt=start
    )
    if user is not None:
        allocations = allocations.filter(booking__owner=user)
    events: list[tuple[datetime, float]] = []
    for a_start, a_end, fraction in allocations.values_list("start", "end", "fraction"):
        events += [(max(a_start, start), fraction), (min(a_end, end), -fraction)]
    peak = level = 0.0
    for _, delta in sorted(events, key=lambda e: (e[0], e[1])):
        level += delta
        peak = max(peak, level)
    return round(peak, 4)


def quota_overview(*, user, now: datetime) -> list[dict]:
    """The user's limits and current use in each of their projects (GET me/quota/)."""
    rows = []
    for membership in user.memberships.select_related("project").order_by("project__slug"):
        project = membership.project
        quota = quota_effective(project=project, user=user)
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
                },
                "usage": {"gpus_in_use": mine.gpus_in_use, "gpu_hours_used": mine.gpu_hours_used},
                "project_usage": {
                    "gpus_in_use": theirs.gpus_in_use,
                    "gpu_hours_used": theirs.gpu_hours_used,
                },
            }
        )
    return rows
