"""Multifactor priority (age, fair share, size, QOS) and decayed usage, Slurm style."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from scheduler import sharing
from scheduler.types import Device, Policy, Priority, Request

_LN2 = math.log(2.0)


def decay_usage(
    records: Iterable[tuple[str, float, float, float]], now: float, half_life_s: float
) -> dict[str, float]:
    """Decayed GPU-seconds per project from (project, start, end, gpu_equivalents) records.

    Each second of use counts 2^(-age/half_life), so a second used one half-life ago counts half.
    Use after ``now`` is ignored. The portal and the replay both call this, so fair share is
    computed one way.
    """
    usage: dict[str, float] = {}
    scale = half_life_s / _LN2
    for project, start, end, gpus in records:
        end = min(end, now)
        if end <= start:
            continue
        weight = 2.0 ** (-(now - end) / half_life_s) - 2.0 ** (-(now - start) / half_life_s)
        usage[project] = usage.get(project, 0.0) + gpus * scale * weight
    return usage


def charged_fraction(utilization: float | None, policy: Policy) -> float:
    """The share of an allocated GPU-second that fair share charges (``Policy.fairshare_charge``).

    ``utilization`` is the device's mean utilization over the allocation in [0, 1], None when
    not measured (charged in full).
    """
    if policy.fairshare_charge == "allocated" or utilization is None:
        return 1.0
    measured = max(min(utilization, 1.0), policy.fairshare_idle_floor)
    if policy.fairshare_charge == "measured":
        return measured
    return policy.fairshare_blend + (1.0 - policy.fairshare_blend) * measured


def carry_usage(
    usage: Mapping[str, float], elapsed_s: float, half_life_s: float
) -> dict[str, float]:
    """Decay already-decayed usage by ``elapsed_s`` more seconds (for incremental callers)."""
    factor = 2.0 ** (-elapsed_s / half_life_s)
    return {project: value * factor for project, value in usage.items()}


def request_size(request: Request, devices_by_profile: Mapping) -> float:
    """GPU-equivalents a request asks for (a MIG instance counts its fraction of a GPU, a
    fraction of a shared GPU its share: ``sharing.request_share``)."""
    if request.fractional:
        return sharing.request_share(request, devices_by_profile)
    if request.mig_profile is None:
        return float(request.gpus)
    return request.gpus * devices_by_profile.get(request.mig_profile, 1.0)


def profile_fractions(devices: Iterable[Device]) -> dict:
    """The GPU fraction of each MIG profile seen in the inventory, and the largest memory of
    its shared GPUs (``sharing.shared_memories``)."""
    devices = tuple(devices)
    fractions: dict = {device.profile: device.fraction for device in devices}
    fractions.update(sharing.shared_memories(devices))
    return fractions


def fairshare_factors(
    projects: Iterable[str], shares: Mapping[str, float], usage: Mapping[str, float]
) -> dict[str, float]:
    """Slurm's classic fair-share factor 2^(-usage_fraction / share_fraction) per project.

    A project with no share listed gets a share of 1; with no usage at all every factor is 1.
    """
    names = set(projects) | set(shares) | set(usage)
    total_shares = sum(shares.get(name, 1.0) for name in names) or 1.0
    total_usage = sum(usage.get(name, 0.0) for name in names)
    factors = {}
    for name in names:
        share = shares.get(name, 1.0) / total_shares
        used = usage.get(name, 0.0) / total_usage if total_usage > 0 else 0.0
        factors[name] = 2.0 ** (-used / share) if share > 0 else 0.0
    return factors


@dataclass(frozen=True)
class Scales:
    """A policy's scales made absolute for one pass (see ``Policy``): seconds and GPU-seconds."""

    run_s: float
    age_max_s: float
    size_scale_gpu_s: float
    size_width_gpus: float | None
    protect_after_s: float | None


def typical_run(policy: Policy, durations: Iterable[float]) -> float:
    """The ``run_quantile`` quantile (nearest rank) of run durations, at least ``run_floor_s``."""
    ordered = sorted(durations)
    if not ordered:
        return policy.run_floor_s
    rank = max(1, math.ceil(policy.run_quantile * len(ordered)))
    return max(policy.run_floor_s, ordered[rank - 1])


def site_scales(policy: Policy, capacity: float, durations: Iterable[float]) -> Scales:
    """The scales of one pass on a site of ``capacity`` GPU-equivalents, given the requested
    durations of the running allocations (the running workload)."""
    run = typical_run(policy, durations)
    capacity = max(capacity, 1.0)
    if policy.size_width_gpus is not None:
        width = policy.size_width_gpus
    elif policy.size_width_share is not None:
        width = policy.size_width_share * capacity
    else:
        width = None
    if policy.size_scale_gpu_s is not None:
        scale = policy.size_scale_gpu_s
    elif policy.size_by == "seconds":
        scale = policy.size_scale_share * run
    else:
        scale = policy.size_scale_share * capacity * run
    protect = None
    if policy.protect_after_runs is not None:
        protect = min(policy.protect_after_runs * run, policy.protect_after_max_s)
    return Scales(
        run_s=run,
        age_max_s=policy.age_max_s if policy.age_max_s is not None else policy.age_max_runs * run,
        size_scale_gpu_s=scale,
        size_width_gpus=width,
        protect_after_s=protect,
    )


def priority_of(
    request: Request, now: float, size: float, fairshare: float, policy: Policy, scales: Scales
) -> Priority:
    """The weighted factors of one pending request and their sum."""
    top_qos = max((level for _, level in policy.qos_levels), default=0) or 1
    aged = min(1.0, max(0.0, now - request.submit_time) / scales.age_max_s)
    age = policy.weight_age * aged
    fair = policy.weight_fairshare * fairshare
    if policy.size_by == "seconds":
        amount = request.duration_s
    else:
        amount = size * request.duration_s
        if scales.size_width_gpus:
            # Wide bookings drain many nodes and hold them; narrow ones take a GPU as it frees.
            amount *= size / scales.size_width_gpus
    small = policy.weight_size / (1.0 + amount / scales.size_scale_gpu_s)
    if policy.size_fades_with_age:
        small *= 1.0 - aged
    qos = policy.weight_qos * policy.qos_level(request.qos) / top_qos
    return Priority(total=age + fair + small + qos, age=age, fairshare=fair, size=small, qos=qos)


def predict_run(recent_runs: Sequence[float], requested_s: float) -> float:
    """The documented run-time prediction: the mean of the user's recent completed run times
    (the last ``Policy.predict_last``), capped by the requested duration, which stays the hard
    end; the requested duration when there is no history."""
    if not recent_runs:
        return requested_s
    return min(requested_s, sum(recent_runs) / len(recent_runs))
