"""Checks a booking request must pass before anything is written. Each names the field at fault."""

from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta

from django.conf import settings

import scheduler
from portal.errors import NoCapacity, QuotaExceeded, ValidationFailed
from portal.models import Project, Qos, mig_fraction
from portal.models.bookings import mig_profile_slices
from portal.services.booking.booking_bounds import request_bounds
from portal.services.booking.quotas import EffectiveQuota, QuotaPosition, quota_position
from portal.services.booking.sharing_rules import check_fraction, is_fraction_request
from portal.services.core.policy import scheduler_policy
from portal.services.core.units import parse_memory_mib
from portal.services.inventory import selectors as inventory
from portal.services.inventory.resources import node_capacities

PAST_SLACK = timedelta(seconds=60)


@dataclass(frozen=True)
class BookingRequest:
    """A validated request, ready to place or queue."""

    project: Project
    gpus: int
    mig_profile: str
    gpu_model: str
    mixed_models: bool  # any models will do (scheduler.placement.keeps_one_model)
    start: datetime | None
    end: datetime | None
    duration_s: int
    qos: str
    preemptible: bool
    command: str
    gpu_equivalents: float
    quota: EffectiveQuota  # the user's limits in the project (override, else the project's)
    limits: QuotaPosition  # the user's and the project's limits, nothing used or held
    # A fraction of one shared GPU (booking.sharing_rules): its share, its memory (MiB).
    gpu_fraction: float | None = None
    gpu_memory_mib: int | None = None
    # CPU cores and host memory per node (None: the site's default, resources.node_demand).
    cpus: int | None = None
    memory_mib: int | None = None


# A booking's cores and memory are PositiveIntegerFields.
HOST_MAX = 2**31 - 1


def resolve_project(*, user, slug: str | None) -> Project:
    """The project named by slug among the user's, or the user's only project."""
    mine = Project.objects.filter(memberships__user=user).order_by("slug")
    if slug:
        project = mine.filter(slug=slug).first()
        if project is None:
            raise ValidationFailed.field("project", f"'{slug}' is not one of your projects.")
        return project
    projects = list(mine[:10])
    if len(projects) == 1:
        return projects[0]
    if not projects:
        raise ValidationFailed.field(
            "project", "you are not a member of any project; ask an admin."
        )
    names = ", ".join(p.slug for p in projects)
    raise ValidationFailed.field("project", f"required: you are in several projects ({names}).")


def check_request(
    *,
    user,
    now: datetime,
    project: str | None,
    gpus: int | None,
    mig_profile: str | None,
    gpu_model: str | None,
    start: datetime | None,
    end: datetime | None,
    duration_s: int | None,
    qos: str,
    preemptible: bool,
    command: str,
    mixed_models: bool = False,
    gpu_fraction: float | None = None,
    gpu_memory_mib: int | None = None,
    cpus: int | None = None,
    memory_mib: int | str | None = None,
) -> BookingRequest:
    """Validate a submission against the inventory, the window rules and the quota.

    ``cpus`` and ``memory_mib`` (MiB, or a size with a unit: "64G") are per node."""
    host = _check_host(cpus=cpus, memory_mib=memory_mib, gpus=gpus)
    proj = resolve_project(user=user, slug=project)
    limits = quota_position(project=proj, user=user, now=now, use=False)
    quota = limits.user_limits
    start, end, duration = _check_window(now=now, start=start, end=end, duration_s=duration_s)
    if mixed_models and gpu_model:
        raise ValidationFailed.field(
            "mixed_models", "give either gpu_model (one model) or mixed_models, not both."
        )
    model = _check_model(gpu_model or "", quota, mig=bool(mig_profile))
    request = BookingRequest(
        project=proj,
        gpus=0,
        mig_profile="",
        gpu_model=model,
        mixed_models=bool(mixed_models) and not model,
        start=start,
        end=end,
        duration_s=duration,
        qos=_check_qos(qos, quota),
        preemptible=preemptible,
        command=command or "",
        gpu_equivalents=0.0,
        quota=quota,
        limits=limits,
    )
    if is_fraction_request(gpu_fraction=gpu_fraction, gpu_memory_mib=gpu_memory_mib):
        request = check_fraction(
            request,
            gpus=gpus,
            mig_profile=mig_profile or "",
            gpu_fraction=gpu_fraction,
            gpu_memory_mib=gpu_memory_mib,
        )
    else:
        request = _check_what(request, gpus=gpus, mig_profile=mig_profile or "")
    request = replace(request, cpus=host[0], memory_mib=host[1])
    _check_limits(request)
    return request


def _check_host(
    *, cpus: int | None, memory_mib: int | str | None, gpus: int | None
) -> tuple[int | None, int | None]:
    """The cores and memory (MiB) asked per node: whole numbers from 1, memory also as a size
    with a unit ("64G", "512M", "1T"; a bare number is MiB)."""
    if not settings.SCHEDULE_CORES_MEMORY:
        for name, value in (("cpus", cpus), ("memory_mib", memory_mib)):
            if value is not None:
                raise ValidationFailed.field(
                    name, "this site books GPUs alone, not cores or memory (SCHEDULE_CORES_MEMORY)."
                )
    if cpus is not None:
        if isinstance(cpus, bool) or not isinstance(cpus, int):
            raise ValidationFailed.field("cpus", "must be a whole number of cores.")
        if not 1 <= cpus <= HOST_MAX:
            raise ValidationFailed.field("cpus", f"must be between 1 and {HOST_MAX}.")
    if isinstance(memory_mib, str):
        try:
            memory_mib = parse_memory_mib(memory_mib)
        except ValueError as exc:
            raise ValidationFailed.field("memory_mib", f"{exc}.") from None
    elif memory_mib is not None:
        if isinstance(memory_mib, bool) or not isinstance(memory_mib, int):
            raise ValidationFailed.field("memory_mib", "must be MiB or a size such as 64G.")
        if not 1 <= memory_mib <= HOST_MAX:
            raise ValidationFailed.field("memory_mib", f"must be between 1 and {HOST_MAX} MiB.")
    if (cpus is not None or memory_mib is not None) and gpus is not None and gpus < 1:
        raise ValidationFailed.field("gpus", "cores and memory are booked with GPUs: at least 1.")
    return cpus, memory_mib


def _check_window(*, now, start, end, duration_s) -> tuple[datetime | None, datetime | None, int]:
    if (start is None) != (end is None):
        missing = "end" if end is None else "start"
        raise ValidationFailed.field(missing, "a reservation needs both start and end.")
    if start is not None and duration_s is not None:
        raise ValidationFailed.field(
            "duration_s", "give either start and end, or duration_s, not both."
        )
    if start is None:
        if duration_s is None:
            raise ValidationFailed.field("duration_s", "required unless start and end are given.")
        return None, None, duration_s
    if end <= start:
        raise ValidationFailed.field("end", "must be after start.")
    if start < now - PAST_SLACK:
        raise ValidationFailed.field("start", "is in the past.")
    # Room left to extend it to the site maximum: past this, end + extension overflows datetime.
    if end > datetime.max.replace(tzinfo=UTC) - timedelta(seconds=request_bounds().duration_max_s):
        raise ValidationFailed.field("end", "is too far in the future.")
    start = max(start, now)
    return start, end, int((end - start).total_seconds())


def _check_model(gpu_model: str, quota: EffectiveQuota, *, mig: bool) -> str:
    """The model to book: as asked, or the only one the quota allows (the allocator needs one)."""
    known = inventory.mig_gpu_models() if mig else inventory.gpu_models()
    if gpu_model and gpu_model not in known:
        raise ValidationFailed.field(
            "gpu_model", f"unknown GPU model '{gpu_model}'; known: {', '.join(known) or 'none'}."
        )
    allowed = quota.allowed_models
    if not allowed or gpu_model in allowed:
        return gpu_model
    if gpu_model:
        raise ValidationFailed.field("gpu_model", f"your quota allows only {', '.join(allowed)}.")
    usable = [model for model in allowed if model in known]
    if len(usable) == 1:
        return usable[0]
    raise ValidationFailed.field(
        "gpu_model", f"required: your quota allows only {', '.join(allowed)}; pick one."
    )


def _check_qos(qos: str, quota: EffectiveQuota) -> str:
    if qos not in Qos.values:
        raise ValidationFailed.field("qos", f"unknown QOS '{qos}'; one of {', '.join(Qos.values)}.")
    if quota.allowed_qos and qos not in quota.allowed_qos:
        raise ValidationFailed.field(
            "qos", f"your quota allows only {', '.join(quota.allowed_qos)}."
        )
    return qos


def _check_what(request: BookingRequest, *, gpus: int | None, mig_profile: str) -> BookingRequest:
    if gpus is not None and mig_profile:
        raise ValidationFailed.field(
            "gpus", "give either gpus (whole GPUs) or mig_profile, not both."
        )
    if mig_profile:
        return _check_mig(request, mig_profile)
    if gpus is None:
        raise ValidationFailed.field(
            "gpus", "required: a number of whole GPUs, or give mig_profile."
        )
    bounds = request_bounds()
    if gpus < bounds.gpus_min:
        raise ValidationFailed.field("gpus", f"must be at least {bounds.gpus_min}.")
    if gpus > bounds.gpus_max:
        raise ValidationFailed.field("gpus", f"at most {bounds.gpus_max} in one request here.")
    return replace(request, gpus=gpus, gpu_equivalents=float(gpus))


def _check_mig(request: BookingRequest, mig_profile: str) -> BookingRequest:
    profiles = inventory.mig_profiles(gpu_model=request.gpu_model)
    if mig_profile not in profiles:
        raise ValidationFailed.field(
            "mig_profile",
            f"unknown MIG profile '{mig_profile}'; available: {', '.join(profiles) or 'none'}.",
        )
    # Counted as a booking of it counts (Booking.gpu_equivalents), before any slice is held.
    fraction = mig_fraction(mig_profile_slices(mig_profile))
    return replace(request, mig_profile=mig_profile, gpu_equivalents=fraction)


def _check_limits(request: BookingRequest) -> None:
    quota = request.quota
    field = "end" if request.start else "duration_s"
    site_max = request_bounds().duration_max_s
    if request.duration_s > site_max:
        raise ValidationFailed.field(field, f"bookings last at most {site_max} s on this site.")
    if quota.max_duration_s and request.duration_s > quota.max_duration_s:
        raise _quota_refusal(
            field,
            f"your quota allows bookings of at most {quota.max_duration_s} s.",
            limit="max_duration_s",
            limit_value=quota.max_duration_s,
            asks=request.duration_s,
        )
    _check_admission(request)


def _check_admission(request: BookingRequest) -> None:
    """Could it ever run, on this inventory under these limits? The scheduler's rules answer
    (those of the allocator, or of reservation placement for a fixed window); use so far does
    not count: the budget period rolls. A refusal is a conflict with the site (409): no capacity
    for it, or over a quota; only a request with no duration left is bad input (400)."""
    asked = scheduler.Request(
        booking_id="new",
        user="",
        project="",
        submit_time=0.0,
        duration_s=float(request.duration_s),
        gpus=request.gpus or 1,
        mig_profile=request.mig_profile or None,
        gpu_model=request.gpu_model or None,
        mixed_models=request.mixed_models,
        gpu_fraction=request.gpu_fraction,
        gpu_memory_mib=request.gpu_memory_mib,
        cpus=request.cpus,
        memory_mib=request.memory_mib,
    )
    refusal = scheduler.admission_refusal(
        asked,
        inventory.admission_devices(),
        request.limits.sides,
        fixed_window=request.start is not None,
        **_admission_resources(),
    )
    if refusal is None:
        return
    what = _what_field(request)
    when = "end" if request.start else "duration_s"
    if refusal.limit == "request":
        raise ValidationFailed.field(when, "must leave the booking a positive duration.")
    if refusal.limit in _HOST_FIELDS:
        # More cores or memory than any node that could hold its GPUs has: bad input.
        field = _HOST_FIELDS[refusal.limit]
        raise ValidationFailed.field(field, refusal.text or f"no node has that many {field}.")
    if refusal.limit in _HOST_QUOTA_FIELDS:
        field = _HOST_QUOTA_FIELDS[refusal.limit]
        whose = "your project's" if refusal.scope == "project" else "your"
        reason = (
            f"asks for {refusal.asks:g} but {whose} quota allows {refusal.limit_value:g} at once."
        )
        raise _quota_refusal(field, reason, limit=refusal.limit, **_amounts(refusal))
    if refusal.limit == "inventory":
        reason = _inventory_refusal(request, refusal)
        raise NoCapacity(f"{what}: {reason}", fields={what: reason})
    whose = "your project's" if refusal.scope == "project" else "your"
    if refusal.limit == "max_gpus":
        reason = (
            f"asks for {round(request.gpu_equivalents, 2):g} GPUs but {whose} quota allows "
            f"{refusal.limit_value:g} at once."
        )
        raise _quota_refusal(what, reason, limit="max_gpus", **_amounts(refusal))
    reason = (
        f"needs {refusal.asks:.1f} GPU-hours but {whose} budget is {refusal.limit_value:g} "
        "per period."
    )
    raise _quota_refusal(when, reason, limit="gpu_hours_budget", **_amounts(refusal))


# The admission refusals of cores and memory (scheduler/admission.py), by the field at fault.
_HOST_FIELDS = {"cpus": "cpus", "memory": "memory_mib", "memory_mib": "memory_mib"}
_HOST_QUOTA_FIELDS = {"max_cpus": "cpus", "max_memory_mib": "memory_mib"}


def _admission_resources() -> dict:
    """The nodes' cores and memory for the admission check, keyed as admission_devices names
    nodes (by id), and the policy's defaults per GPU."""
    capacities = node_capacities()
    if not capacities:
        return {}
    return {
        "node_resources": {str(pk): cap for pk, cap in capacities.items()},
        "policy": scheduler_policy(),
    }


def _what_field(request: BookingRequest) -> str:
    """The field that says what a request asks for: gpus, mig_profile or its fraction's."""
    if request.gpu_fraction is not None:
        return "gpu_fraction"
    if request.gpu_memory_mib is not None:
        return "gpu_memory_mib"
    return "gpus" if request.gpus else "mig_profile"


def _amounts(refusal: scheduler.Refusal) -> dict:
    return {"limit_value": refusal.limit_value, "usage": 0.0, "asks": refusal.asks}


def _quota_refusal(field: str, reason: str, **extra) -> QuotaExceeded:
    """A request over a quota limit even with nothing in use: 409 `quota`, naming the field and
    the limit (`limit`, `limit_value`, `asks`), like the refusals that count use."""
    return QuotaExceeded(f"Quota {extra['limit']}: {reason}", fields={field: reason}, extra=extra)


def _inventory_refusal(request: BookingRequest, refusal: scheduler.Refusal) -> str:
    model = f" {request.gpu_model}" if request.gpu_model else ""
    if request.gpu_fraction is not None or request.gpu_memory_mib is not None:
        return f"no shared{model} GPU of the cluster can hold this fraction."
    if request.mig_profile:
        return f"no{model} GPU of the cluster has a {request.mig_profile} instance to book."
    most = int(refusal.limit_value)
    if request.start is not None:
        return f"asks for {request.gpus} but the cluster has {most}{model} GPUs."
    return (
        f"asks for {request.gpus} but the cluster has {most}{model} GPUs for one queued "
        "booking (on one node, or on whole nodes of whole GPUs of one model)."
    )
