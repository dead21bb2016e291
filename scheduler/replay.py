"""Trace replay: drive ``plan()`` through a discrete-event loop and print one JSON line of metrics.

    python -m scheduler.replay TRACE.csv --gpus N [--gpus-per-node 8] [--estimate-factor F]
        --policy fifo|easy|portal [--project-column vc]

The loop calls the allocator only at events (submits and ends) with that instant as ``now``.
"portal" is ``plan`` with ``PORTAL_POLICY``, the default the workers use; "fifo" and "easy" are
the same function with ``backfill="none"`` / ``"easy"`` and all priority weights at zero, so the
queue is in arrival order. Traces carry no users: each job gets the synthetic user
``synthetic-<crc32(job_id) % 32>``; they are only labels (no user quotas in a replay).
"""

from __future__ import annotations

import argparse
import csv
import heapq
import json
import math
import sys
import zlib
from dataclasses import dataclass

from scheduler.allocator import plan
from scheduler.priority import carry_usage, decay_usage
from scheduler.types import Allocation, Device, Policy, Request, State

PORTAL_POLICY = Policy()
# Arrival order: every weight 0 and no starvation guard (it would reorder old bookings by width).
_ARRIVAL = dict(
    weight_age=0.0, weight_fairshare=0.0, weight_size=0.0, weight_qos=0.0, starve_after_s=None
)
POLICIES = {
    "fifo": Policy(backfill="none", reservation_depth=1, estimate_all=False, **_ARRIVAL),
    "easy": Policy(backfill="easy", estimate_all=False, **_ARRIVAL),
    "portal": PORTAL_POLICY,
}
SYNTHETIC_USERS = 32
BSLD_BOUND_S = 10.0


@dataclass(frozen=True)
class Job:
    """One trace row: ``walltime`` is what the allocator is told, ``duration`` what really runs."""

    job_id: str
    user: str
    project: str
    submit: float
    duration: float
    walltime: float
    gpus: int


def synthetic_user(job_id: str) -> str:
    """The documented rule that labels a trace job with a (synthetic) user."""
    return f"synthetic-{zlib.crc32(job_id.encode()) % SYNTHETIC_USERS}"


def load_jobs(path: str, estimate_factor: float = 1.0, project_column: str | None = None):
    """Read a trace CSV (job_id,user,submit_time_s,duration_s,num_gpus; extra columns ignored)."""
    jobs = []
    with open(path, newline="") as handle:
        for row in csv.DictReader(handle):
            duration = float(row["duration_s"])
            jobs.append(
                Job(
                    job_id=row["job_id"],
                    user=row.get("user") or synthetic_user(row["job_id"]),
                    project=row[project_column] if project_column else "all",
                    submit=float(row["submit_time_s"]),
                    duration=duration,
                    walltime=duration * estimate_factor,
                    gpus=int(row["num_gpus"]),
                )
            )
    jobs.sort(key=lambda job: (job.submit, job.job_id))
    return jobs


def cluster(gpus: int, gpus_per_node: int = 8) -> tuple[Device, ...]:
    """Whole GPUs on nodes of ``gpus_per_node`` (the last node may be smaller)."""
    return tuple(
        Device(
            id=f"n{i // gpus_per_node:03d}-g{i % gpus_per_node}",
            node=f"n{i // gpus_per_node:03d}",
            model="gpu",
        )
        for i in range(gpus)
    )


class Replay:
    """The event loop: state of a replay between events."""

    def __init__(self, jobs: list[Job], devices: tuple[Device, ...], policy: Policy) -> None:
        self.devices, self.policy = devices, policy
        capacity = len(devices)
        self.jobs = [job for job in jobs if job.gpus <= capacity and job.gpus > 0]
        self.skipped = len(jobs) - len(self.jobs)
        self.by_id = {job.job_id: job for job in self.jobs}
        self.pending: dict[str, Request] = {}
        self.running: dict[str, Allocation] = {}
        self.ends: list[tuple[float, str]] = []
        self.started: dict[str, float] = {}
        self.usage: dict[str, float] = {}
        self.usage_time = 0.0
        self.projects = sorted({job.project for job in self.jobs})

    def run(self) -> None:
        """Replay every job to its end."""
        arrivals, i = self.jobs, 0
        while i < len(arrivals) or self.ends:
            now = min(
                arrivals[i].submit if i < len(arrivals) else math.inf,
                self.ends[0][0] if self.ends else math.inf,
            )
            finished = self._finish_until(now)
            while i < len(arrivals) and arrivals[i].submit == now:
                self._submit(arrivals[i])
                i += 1
            self._decay(now, finished)
            if self.pending:
                self._schedule(now)

    def _submit(self, job: Job) -> None:
        self.pending[job.job_id] = Request(
            booking_id=job.job_id,
            user=job.user,
            project=job.project,
            submit_time=job.submit,
            duration_s=job.walltime,
            gpus=job.gpus,
        )

    def _finish_until(self, now: float) -> list[Allocation]:
        finished = []
        while self.ends and self.ends[0][0] <= now:
            _, job_id = heapq.heappop(self.ends)
            finished.append(self.running.pop(job_id))
        return finished

    def _decay(self, now: float, finished: list[Allocation]) -> None:
        """Fair-share usage at ``now``, kept incrementally with the allocator's own decay rule."""
        half_life = self.policy.fairshare_half_life_s
        self.usage = carry_usage(self.usage, now - self.usage_time, half_life)
        records = [(a.project, a.start, now, len(a.device_ids)) for a in finished]
        for project, value in decay_usage(records, now, half_life).items():
            self.usage[project] = self.usage.get(project, 0.0) + value
        self.usage_time = now

    def _running_usage(self, now: float) -> dict[str, float]:
        records = [(a.project, a.start, now, len(a.device_ids)) for a in self.running.values()]
        live = decay_usage(records, now, self.policy.fairshare_half_life_s)
        return {p: self.usage.get(p, 0.0) + live.get(p, 0.0) for p in self.projects}

    def _schedule(self, now: float) -> None:
        state = State(
            now=now,
            devices=self.devices,
            allocations=tuple(self.running.values()),
            pending=tuple(self.pending.values()),
            project_shares={project: 1.0 for project in self.projects},
            project_usage=self._running_usage(now) if self.policy.weight_fairshare else {},
        )
        for start in plan(state, self.policy).starts:
            job = self.by_id[start.booking_id]
            del self.pending[job.job_id]
            # A job that outruns its walltime is stopped there, as the portal would.
            end = now + min(job.duration, job.walltime)
            self.running[job.job_id] = Allocation(
                job.job_id, start.device_ids, now, now + job.walltime, job.user, job.project
            )
            self.started[job.job_id] = now
            heapq.heappush(self.ends, (end, job.job_id))


def metrics(replay: Replay, policy_name: str, gpus: int, project_column: str | None) -> dict:
    """The JSON line: waits, job completion time, bounded slowdown, utilization, makespan."""
    runs = [min(job.duration, job.walltime) for job in replay.jobs]
    waits = [replay.started[job.job_id] - job.submit for job in replay.jobs]
    jcts = [wait + run for wait, run in zip(waits, runs, strict=True)]
    bslds = [max(1.0, jct / max(run, BSLD_BOUND_S)) for jct, run in zip(jcts, runs, strict=True)]
    busy = sum(job.gpus * run for job, run in zip(replay.jobs, runs, strict=True))
    first = min((job.submit for job in replay.jobs), default=0.0)
    makespan = max(
        (job.submit + jct for job, jct in zip(replay.jobs, jcts, strict=True)), default=0.0
    )
    makespan -= first
    out = {
        "policy": policy_name,
        "jobs": len(replay.jobs),
        "skipped": replay.skipped,
        "gpus": gpus,
        "mean_wait_s": _mean(waits),
        "p50_wait_s": _percentile(waits, 50),
        "p95_wait_s": _percentile(waits, 95),
        "p99_wait_s": _percentile(waits, 99),
        "max_wait_s": max(waits, default=0.0),
        "mean_jct_s": _mean(jcts),
        "mean_bsld": _mean(bslds),
        "utilization": busy / (gpus * makespan) if makespan > 0 else 0.0,
        "makespan_s": makespan,
        "users": f"synthetic: crc32(job_id) % {SYNTHETIC_USERS}",
    }
    if project_column:
        out["projects"] = _projects(replay.jobs, runs, waits)
    return out


def _projects(jobs: list[Job], runs: list[float], waits: list[float]) -> dict:
    """GPU-hours, equal share, job count and mean wait per project."""
    hours: dict[str, float] = {}
    project_waits: dict[str, list[float]] = {}
    for job, run, wait in zip(jobs, runs, waits, strict=True):
        hours[job.project] = hours.get(job.project, 0.0) + job.gpus * run / 3600.0
        project_waits.setdefault(job.project, []).append(wait)
    share = 1.0 / len(hours) if hours else 0.0
    return {
        name: {
            "gpu_hours": round(total, 1),
            "share": share,
            "jobs": len(project_waits[name]),
            "mean_wait_s": round(_mean(project_waits[name]), 1),
        }
        for name, total in sorted(hours.items())
    }


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def _percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile."""
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100.0 * len(ordered)))
    return ordered[rank - 1]


def replay_trace(
    path: str,
    gpus: int,
    policy: str,
    gpus_per_node: int = 8,
    estimate_factor: float = 1.0,
    project_column: str | None = None,
    policy_override: Policy | None = None,
) -> dict:
    """Run one replay and return its metrics (what the command line prints)."""
    jobs = load_jobs(path, estimate_factor, project_column)
    chosen = policy_override or POLICIES[policy]
    replay = Replay(jobs, cluster(gpus, gpus_per_node), chosen)
    replay.run()
    return metrics(replay, policy, gpus, project_column)


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(
        prog="python -m scheduler.replay", description=__doc__.splitlines()[0]
    )
    parser.add_argument("trace")
    parser.add_argument("--gpus", type=int, required=True)
    parser.add_argument("--gpus-per-node", type=int, default=8)
    parser.add_argument("--estimate-factor", type=float, default=1.0)
    parser.add_argument("--policy", choices=sorted(POLICIES), default="portal")
    parser.add_argument("--project-column", default=None)
    args = parser.parse_args(argv)
    result = replay_trace(
        args.trace,
        args.gpus,
        args.policy,
        args.gpus_per_node,
        args.estimate_factor,
        args.project_column,
    )
    sys.stdout.write(json.dumps(result) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
