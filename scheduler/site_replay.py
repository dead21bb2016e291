"""Every preset replayed on one site's own history (docs/scheduling.md, "The site's frontier").

``replay_presets`` replays a trace (``replay.Job`` rows, e.g. a portal's history from
portal/services/reporting/site_history.py) under each candidate policy at several loads: a load
``L`` replays the same jobs arriving ``L`` times as fast (their submit times, counted from the
first, divided by ``L``), on the same GPUs. Each row holds the replay's metrics plus the waits
of the widest tenth of the jobs (by GPUs, then GPU-seconds) and the policy's no-starvation bound.
``dominating`` names the policies that dominate one (``frontier.dominates``) at a load.
Pure: the portal's command and page read the inputs and print or show the rows.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from dataclasses import replace

from scheduler.frontier import dominates, starvation_bound
from scheduler.presets import REFERENCE_NAMES, preset_policy
from scheduler.replay import PORTAL_POLICY, Job, Replay, metrics
from scheduler.types import Device, Policy

LOADS = (0.75, 1.0, 1.25)
LOAD_RANGE = (0.25, 4.0)
WIDEST_SHARE = 0.10


def candidates(current: Policy) -> dict[str, Policy]:
    """The policies a site compares: the site's own (``current``), the shipped default, the
    reference presets, and the default with run-time prediction (its users' last 2 runs)."""
    out = {"current": current, "portal": PORTAL_POLICY}
    out.update({name: preset_policy(name) for name in REFERENCE_NAMES})
    out["portal-predict"] = replace(PORTAL_POLICY, predict_last=2)
    return out


def at_load(jobs: list[Job], load: float) -> list[Job]:
    """The jobs arriving ``load`` times as fast (submit times from the first one, / load)."""
    if not jobs:
        return []
    first = min(job.submit for job in jobs)
    return [replace(job, submit=first + (job.submit - first) / load) for job in jobs]


def replay_presets(
    jobs: list[Job],
    devices: tuple[Device, ...],
    policies: Mapping[str, Policy],
    loads: tuple[float, ...] = LOADS,
    progress: Callable[[int, int, str, float, float], None] | None = None,
) -> list[dict]:
    """One row per (load, policy), loads in order: the replay's metrics, ``load``, the widest
    tenth's ``widest_mean_wait_s`` / ``widest_max_wait_s``, ``bound`` and ``seconds`` (wall
    time of that replay). ``progress(done, total, policy, load, seconds)`` after each one."""
    rows, total, done = [], len(policies) * len(loads), 0
    gpus = len({device.parent or device.id for device in devices})
    for load in loads:
        loaded = at_load(jobs, load)
        for name, policy in policies.items():
            began = time.perf_counter()
            replay = Replay(loaded, devices, policy)
            replay.run()
            row = metrics(replay, name, gpus, None)
            row.update(_widest(replay))
            row["load"] = load
            row["bound"] = starvation_bound(policy)
            row["seconds"] = round(time.perf_counter() - began, 3)
            rows.append(row)
            done += 1
            if progress is not None:
                progress(done, total, name, load, row["seconds"])
    return rows


def _widest(replay: Replay) -> dict:
    """Mean and max wait of the widest tenth of the jobs that started (most GPUs, then most
    GPU-seconds, then the id)."""
    started = [job for job in replay.jobs if job.job_id in replay.started]
    started.sort(key=lambda job: (-job.gpus * job.fraction, -job.gpus * job.duration, job.job_id))
    widest = started[: max(1, math.ceil(len(started) * WIDEST_SHARE))] if started else []
    waits = [replay.started[job.job_id] - job.submit for job in widest]
    return {
        "widest_jobs": len(widest),
        "widest_mean_wait_s": sum(waits) / len(waits) if waits else 0.0,
        "widest_max_wait_s": max(waits, default=0.0),
    }


def dominating(rows: list[dict], policy: str, load: float = 1.0) -> list[str]:
    """The policies whose row at ``load`` dominates ``policy``'s there."""
    here = {row["policy"]: row for row in rows if row["load"] == load}
    mine = here[policy]
    return [name for name, row in here.items() if name != policy and dominates(row, mine)]
