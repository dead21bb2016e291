"""The site's own history as the replay's input (docs/api.md, "The site's history as a trace").

The bookings submitted in a period that have ended (finished, failed, expired, preempted or
cancelled) become rows of the trace format ``scheduler.replay.load_jobs`` reads: the submit time
(seconds from the period's start), the time the booking really held its devices (``duration_s``)
and the time it asked for (``requested_s``), its GPUs (or MIG profile, or fraction), model, user,
project, QOS, the state it ended in, its dependencies (``afterok:ID``, as the replay reads them)
and its array. Users and projects are pseudonymised (a keyed hash, the same for the same name in
every export of this site) unless staff ask for the real names. Reads only.
"""

from __future__ import annotations

import csv
import hashlib
import hmac
import io
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db.models import Count, Q

from portal.errors import ValidationFailed
from portal.models import Booking, BookingDependency, Gpu

MAX_DAYS = 366
MAX_ROWS = 200_000  # a trace larger than this is refused: ask for a shorter period
COLUMNS = (
    "job_id",
    "user",
    "project",
    "submit_time_s",
    "duration_s",
    "requested_s",
    "num_gpus",
    "gpu_model",
    "mig_profile",
    "gpu_fraction",
    "qos",
    "state",
    "dependency",
    "array",
)
ENDED = (
    Booking.State.FINISHED,
    Booking.State.FAILED,
    Booking.State.EXPIRED,
    Booking.State.PREEMPTED,
    Booking.State.CANCELLED,
)


@dataclass(frozen=True)
class SiteTrace:
    """A period of the site's history: its rows (``COLUMNS``), the whole GPUs of each model
    the inventory has now, and whether the names are pseudonyms."""

    since: datetime
    until: datetime
    rows: list[dict]
    inventory: dict[str, int]
    pseudonymised: bool


def site_history(*, days: int, now: datetime, real_names: bool = False) -> SiteTrace:
    """The ended bookings submitted in the ``days`` before ``now`` as a trace; a period out of
    range (1 to MAX_DAYS), one with no ended bookings, or one past MAX_ROWS is refused with a
    400 naming ``days``."""
    if isinstance(days, bool) or not isinstance(days, int) or not 1 <= days <= MAX_DAYS:
        raise ValidationFailed.field(
            "days", f"must be a whole number of days from 1 to {MAX_DAYS}."
        )
    since = now - timedelta(days=days)
    bookings = Booking.objects.filter(
        submitted_at__gte=since, submitted_at__lt=now, state__in=ENDED
    ).order_by("submitted_at", "pk")
    count = bookings.count()
    if count == 0:
        raise ValidationFailed.field(
            "days",
            f"no booking submitted from {since:%Y-%m-%d %H:%M} to {now:%Y-%m-%d %H:%M} UTC has "
            "ended yet: nothing to replay.",
        )
    if count > MAX_ROWS:
        raise ValidationFailed.field(
            "days", f"{count} bookings in that period, more than {MAX_ROWS}: ask for fewer days."
        )
    rows = list(
        bookings.values_list(
            "pk",
            "owner__username",
            "project__slug",
            "submitted_at",
            "started_at",
            "ended_at",
            "duration_s",
            "gpus",
            "gpu_model",
            "mig_profile",
            "gpu_fraction",
            "qos",
            "state",
            "array_parent_id",
        )
    )
    after = _dependencies({row[0] for row in rows})
    name = (lambda kind, value: value) if real_names else _pseudonym
    out = []
    for pk, user, project, submitted, started, ended, asked, gpus, model, profile, *rest in rows:
        fraction, qos, state, array = rest
        ran = (ended - started).total_seconds() if started and ended else 0.0
        out.append(
            {
                "job_id": str(pk),
                "user": name("u", user),
                "project": name("p", project),
                "submit_time_s": round((submitted - since).total_seconds(), 3),
                "duration_s": round(max(ran, 0.0), 3),
                "requested_s": asked,
                "num_gpus": gpus,
                "gpu_model": model,
                "mig_profile": profile,
                "gpu_fraction": "" if fraction is None else fraction,
                "qos": qos,
                "state": state,
                "dependency": ",".join(after.get(pk, ())),
                "array": "" if array is None else str(array),
            }
        )
    return SiteTrace(since, now, out, _inventory(), not real_names)


def trace_csv(trace: SiteTrace) -> str:
    """The trace as CSV (``COLUMNS``), the format ``python -m scheduler.replay`` reads."""
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=COLUMNS, lineterminator="\n")
    writer.writeheader()
    writer.writerows(trace.rows)
    return buffer.getvalue()


def trace_json(trace: SiteTrace) -> dict:
    """The trace as one JSON document: the period, the inventory, the rows."""
    return {
        "since": trace.since.isoformat(),
        "until": trace.until.isoformat(),
        "pseudonymised": trace.pseudonymised,
        "inventory": trace.inventory,
        "columns": list(COLUMNS),
        "rows": trace.rows,
    }


def _pseudonym(kind: str, value: str) -> str:
    """``u-<12 hex>`` / ``p-<12 hex>``: keyed by the site's secret, so the same name gets the
    same pseudonym in every export of this site and no other site can reverse it."""
    key = settings.SECRET_KEY.encode()
    digest = hmac.new(key, f"{kind}:{value}".encode(), hashlib.sha256).hexdigest()
    return f"{kind}-{digest[:12]}"


def _dependencies(ids: set[int]) -> dict[int, list[str]]:
    """Each booking's dependencies as the replay reads them (``afterok:ID``...)."""
    out: dict[int, list[str]] = {}
    rows = BookingDependency.objects.filter(booking_id__in=ids).order_by("booking_id", "pk")
    for booking_id, kind, target in rows.values_list("booking_id", "kind", "target_id"):
        out.setdefault(booking_id, []).append(f"{kind}:{target}")
    return out


def _inventory() -> dict[str, int]:
    """Whole live GPUs per model (the inventory the trace is replayed on)."""
    rows = (
        Gpu.objects.filter(retired_at__isnull=True)
        .values("model")
        .annotate(count=Count("pk", filter=Q(retired_at__isnull=True)))
        .order_by("model")
    )
    return {row["model"]: row["count"] for row in rows}
