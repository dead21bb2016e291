"""Every preset replayed on the site's own history (scheduler/site_replay.py does the work;
this reads its inputs: the history as a trace, the inventory, the policy in force)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from portal.errors import ValidationFailed
from portal.models import Gpu
from portal.services.core.policy import scheduler_policy
from portal.services.reporting.site_history import SiteTrace, site_history
from scheduler import site_replay as pure
from scheduler.replay import cluster, jobs_from_rows


@dataclass(frozen=True)
class SiteReplay:
    """The trace replayed, the GPUs it was replayed on, and one row per (load, policy)."""

    trace: SiteTrace
    gpus: int
    gpus_per_node: int
    rows: list[dict]


def site_replay(
    *,
    days: int,
    now: datetime,
    loads: tuple[float, ...] = pure.LOADS,
    presets: tuple[str, ...] = (),
    progress: Callable[[int, int, str, float, float], None] | None = None,
) -> SiteReplay:
    """Replay the ended bookings of the last ``days`` under every candidate policy (or those
    named in ``presets``) at each load, on the site's whole GPUs as they are now. Bad input is
    a 400 naming ``days``, ``loads`` or ``presets``."""
    policies = pure.candidates(scheduler_policy())
    unknown = [name for name in presets if name not in policies]
    if unknown:
        raise ValidationFailed.field(
            "presets", f"no preset named {', '.join(unknown)}; choose from {', '.join(policies)}."
        )
    low, high = pure.LOAD_RANGE
    if not loads or any(not low <= load <= high for load in loads):
        raise ValidationFailed.field("loads", f"each load must be from {low:g} to {high:g}.")
    if presets:
        policies = {name: policies[name] for name in presets}
    trace = site_history(days=days, now=now, real_names=False)
    gpus, per_node = _whole_gpus()
    if gpus == 0:
        raise ValidationFailed.field("days", "the site has no whole GPU to replay on.")
    jobs = jobs_from_rows(trace.rows, project_column="project")
    jobs.sort(key=lambda job: (job.submit, job.job_id))
    rows = pure.replay_presets(jobs, cluster(gpus, per_node), policies, loads, progress)
    return SiteReplay(trace, gpus, per_node, rows)


def _whole_gpus() -> tuple[int, int]:
    """The live GPUs of the site and the commonest count per node."""
    per_node = Counter(
        Gpu.objects.filter(retired_at__isnull=True).values_list("node_id", flat=True)
    )
    if not per_node:
        return 0, 0
    return sum(per_node.values()), Counter(per_node.values()).most_common(1)[0][0]
