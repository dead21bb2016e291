"""Trace replay: drive ``plan()`` through a discrete-event loop and print one JSON line of metrics.

    python -m scheduler.replay TRACE.csv --gpus N [--gpus-per-node 8] [--estimate-factor F]
        --policy fifo|easy|portal|<reference> [--project-column vc] [--quotas 4x0.25 [--borrowing]]
    python -m scheduler.replay TRACE.csv --gpus N --notebook-share 0.4 [--shared-nodes 1]
        [--seed 0] [--fractions-from openb_gpushare.csv]  (scheduler/notebooks.py)

Optional trace columns: ``dependency`` (``afterok:JOB[:JOB],afterany:JOB``, as the portal's
``--after``) and ``exit_code`` (non-zero: the job fails, for ``afterok``/``afternotok``). A job
whose dependency can never be met never runs: it is counted in ``dependency_never`` and left out
of the other metrics, as the portal ends such a booking.

The loop calls the allocator only at events (submits and ends) with that instant as ``now``.
"portal" is ``plan`` with ``PORTAL_POLICY``, the default the workers use; "fifo" and "easy" are
the same function with ``backfill="none"`` / ``"easy"`` and all priority weights at zero, so the
queue is in arrival order. The reference policies (``easy-sjbf``, ``hrrn-easy``, ``sjf-easy``,
``sjf-protect-12h|1d|2d``, ``conservative``) are the presets of scheduler/presets.py. Traces carry
no users: each job gets the synthetic user
``synthetic-<crc32(job_id) % 32>``; they are only labels (no user quotas in a replay).

``--quotas NxS`` (scheduler/replay_quotas.py) hashes the users into N projects, each limited to
S x the GPUs at once; ``--borrowing`` lets the limits lend (scheduler/borrowing.py). A reclaimed
job goes back to the queue with its submit time, as the portal requeues a batch job; the work it
lost is counted in ``reclaimed_gpu_hours``. The metrics then add the within-quota jobs' waits
apart (``within_*``: jobs whose last run started within their limits) and the borrowed
GPU-hours.
"""

from __future__ import annotations

import argparse
import csv
import heapq
import json
import math
import random
import sys
import zlib
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, replace

from scheduler.allocator import plan
from scheduler.borrowing import borrow_backoff
from scheduler.dependencies import parse_dependency
from scheduler.presets import REFERENCE_NAMES, preset_policy
from scheduler.priority import carry_usage, decay_usage, predict_run
from scheduler.replay_quotas import QuotaModel, parse_quota_model
from scheduler.types import (
    OUTCOME_NOT_OK,
    OUTCOME_OK,
    Allocation,
    Dependency,
    Device,
    Policy,
    Request,
    State,
)

PORTAL_POLICY = Policy()
# Arrival order: every weight 0 and no protection (EASY's head reservation is its own).
_ARRIVAL = dict(
    order="arrival",
    weight_age=0.0,
    weight_fairshare=0.0,
    weight_size=0.0,
    weight_qos=0.0,
    protect_after_runs=None,
    protect_oldest=0,
    explain=False,
)
POLICIES = {
    "fifo": Policy(backfill="none", reservation_depth=1, estimate_all=False, **_ARRIVAL),
    "easy": Policy(backfill="easy", estimate_all=False, **_ARRIVAL),
    "portal": PORTAL_POLICY,
    # The reference policies (scheduler/presets.py); no estimates past the head: same decisions.
    **{name: preset_policy(name, estimate_all=False, explain=False) for name in REFERENCE_NAMES},
    "multifactor": preset_policy("multifactor"),  # the default before issue 26
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
    after: tuple[Dependency, ...] = ()
    failed: bool = False
    fraction: float = (
        1.0  # below 1: a notebook asking that share of one GPU (scheduler/notebooks.py)
    )


def synthetic_user(job_id: str) -> str:
    """The documented rule that labels a trace job with a (synthetic) user."""
    return f"synthetic-{zlib.crc32(job_id.encode()) % SYNTHETIC_USERS}"


def load_jobs(
    path: str,
    estimate_factor: float = 1.0,
    project_column: str | None = None,
    *,
    factor_range: tuple[float, float] | None = None,
    seed: int = 0,
    half: str | None = None,
) -> list[Job]:
    """Read a trace CSV (job_id,user,submit_time_s,duration_s,num_gpus; extra columns ignored).

    Walltime (what the allocator is told) is the row's ``requested_s`` where it has one (a
    portal's own history, portal/services/reporting/site_history.py, whose rows that never ran,
    ``state`` cancelled with no time held, are left out), else ``duration * estimate_factor``, or with
    ``factor_range=(lo, hi)`` ``duration * U(lo, hi)`` rounded up to the hour, U drawn per job
    from a generator seeded by (seed, job id). ``half``: "first" or "second" keeps the jobs
    submitted in that half of the trace's submit span.
    """
    with open(path, newline="") as handle:
        jobs = jobs_from_rows(
            csv.DictReader(handle), estimate_factor, project_column, factor_range, seed
        )
    jobs.sort(key=lambda job: (job.submit, job.job_id))
    if half is not None and jobs:
        middle = (jobs[0].submit + jobs[-1].submit) / 2.0
        first = half == "first"
        jobs = [job for job in jobs if (job.submit < middle) is first]
    return jobs


# A portal history's states that end a booking other than successfully (``afterok`` not met).
NOT_OK_STATES = ("failed", "expired", "preempted", "cancelled")


def jobs_from_rows(
    rows: Iterable[dict],
    estimate_factor: float = 1.0,
    project_column: str | None = None,
    factor_range: tuple[float, float] | None = None,
    seed: int = 0,
) -> list[Job]:
    """The jobs of trace rows (dicts of the CSV's columns, strings or numbers), unsorted, by
    ``load_jobs``' rules."""
    jobs = []
    for row in rows:
        duration = float(row["duration_s"])
        if row.get("state") == "cancelled" and duration <= 0:
            continue  # cancelled before it started: nothing to replay
        walltime = duration * estimate_factor
        if row.get("requested_s"):
            walltime = float(row["requested_s"])
        if factor_range is not None:
            draw = random.Random(f"{seed}:{row['job_id']}").uniform(*factor_range)
            walltime = math.ceil(duration * draw / 3600.0) * 3600.0
        jobs.append(
            Job(
                job_id=row["job_id"],
                user=row.get("user") or synthetic_user(row["job_id"]),
                project=row[project_column] if project_column else "all",
                submit=float(row["submit_time_s"]),
                duration=duration,
                walltime=walltime,
                gpus=int(row["num_gpus"]),
                after=parse_dependency(row["dependency"], numeric=False)
                if row.get("dependency")
                else (),
                failed=(bool(row.get("exit_code")) and int(row["exit_code"]) != 0)
                or row.get("state") in NOT_OK_STATES,
            )
        )
    return jobs


def cluster(gpus: int, gpus_per_node: int = 8, shared_nodes: int = 0) -> tuple[Device, ...]:
    """Whole GPUs on nodes of ``gpus_per_node`` (the last node may be smaller); the GPUs of the
    first ``shared_nodes`` nodes are shared (``Device.shared``: they take fractions only)."""
    return tuple(
        Device(
            id=f"n{i // gpus_per_node:03d}-g{i % gpus_per_node}",
            node=f"n{i // gpus_per_node:03d}",
            model="gpu",
            shared=i // gpus_per_node < shared_nodes,
            # Traces carry no memory figure: a fraction f holds f of it, compute binds.
            memory_mib=81920 if i // gpus_per_node < shared_nodes else 0,
        )
        for i in range(gpus)
    )


class Replay:
    """The event loop: state of a replay between events.

    With ``policy.predict_last`` > 0 a job is planned with its predicted run time (see
    ``predict_run``); the walltime stays the hard end. A running job that outlives its prediction
    keeps its devices and is planned to its walltime from then on. ``track_planned`` plans at
    every submission and records the planned start each job was shown then.
    """

    def __init__(
        self,
        jobs: list[Job],
        devices: tuple[Device, ...],
        policy: Policy,
        track_planned: bool = False,
        quotas: QuotaModel | None = None,
    ) -> None:
        # The reasons of waiting bookings are for people: the decisions are the same without them.
        self.devices, self.policy = devices, replace(policy, explain=False)
        self.capacity = capacity = len(devices)
        # Free capacity of each pool: shared GPUs (True) take fractions only, the others whole
        # GPUs; without shared GPUs a fraction holds a whole GPU (``share``).
        self.shared = any(device.shared for device in devices)
        self.free = {
            pool: float(sum(1 for device in devices if device.shared is pool))
            for pool in (False, True)
        }
        self.jobs = [job for job in jobs if self._fits_cluster(job)]
        self.demands = {job.job_id: self._demand(job) for job in self.jobs}
        self.skipped = len(jobs) - len(self.jobs)
        self.quota_model, self.project_quotas = quotas, {}
        self.quota_refused = 0
        if quotas is not None:
            self.project_quotas = quotas.quotas(capacity)
            fits = [job for job in self.jobs if job.gpus <= quotas.limit(capacity) + 1e-9]
            self.quota_refused = len(self.jobs) - len(fits)
            self.jobs = [replace(job, project=quotas.project_of(job.user)) for job in fits]
        self.borrowed: set[str] = set()  # running borrowed jobs
        self.last_borrowed: dict[str, bool] = {}  # whether each job's last start borrowed
        self.runs: dict[str, int] = {}  # starts of each job (a reclaimed one starts again)
        self.reclaimed_gpu_s = 0.0
        # With borrowing, a pass when each job has waited its reclaim grace (less the warning):
        # a reclaim is due then, and nothing else may happen at that instant.
        self.wakeups: list[float] = []
        self.by_id = {job.job_id: job for job in self.jobs}
        self.pending: dict[str, Request] = {}
        self.running: dict[str, Allocation] = {}
        self.ends: list[tuple[float, str, int]] = []
        self.started: dict[str, float] = {}
        self.usage: dict[str, float] = {}
        self.usage_time = 0.0
        self.projects = sorted({job.project for job in self.jobs})
        self.history: dict[str, deque] = {}
        self.track_planned = track_planned
        weights = (
            policy.weight_age,
            policy.weight_fairshare,
            policy.weight_size,
            policy.weight_qos,
        )
        self.strict_fifo = policy.backfill == "none" and not any(weights)
        self.shown: dict[str, float | None] = {}
        self.outcomes: dict[str, str] = {}
        self.never_met: list[str] = []

    def run(self) -> None:
        """Replay every job to its end."""
        arrivals, i = self.jobs, 0
        while i < len(arrivals) or self.ends:
            now = min(
                arrivals[i].submit if i < len(arrivals) else math.inf,
                self.ends[0][0] if self.ends else math.inf,
                self.wakeups[0] if self.wakeups else math.inf,
            )
            while self.wakeups and self.wakeups[0] <= now:
                heapq.heappop(self.wakeups)
            finished = self._finish_until(now)
            submitted = []
            while i < len(arrivals) and arrivals[i].submit == now:
                self._submit(arrivals[i])
                submitted.append(arrivals[i].job_id)
                i += 1
            self._decay(now, finished)
            show = self.track_planned and submitted
            if not self.pending or not (show or self._may_start()):
                continue
            state = self._state(now)
            if show:
                self._show(state, submitted)
            if self._may_start():
                self._schedule(state)

    def share(self, job: Job) -> float:
        """What a job holds of each of its GPUs: its fraction of a shared GPU, or the whole."""
        return job.fraction if self.shared and job.fraction < 1 else 1.0

    def _demand(self, job: Job) -> tuple[bool, float]:
        """(its pool, the capacity it holds there): shared GPUs for a fraction."""
        share = self.share(job)
        return share < 1, job.gpus * share

    def _fits_cluster(self, job: Job) -> bool:
        """The job fits in its pool when the cluster is idle (else it is skipped)."""
        pool, demand = self._demand(job)
        return 0 < demand <= self.free[pool]

    def _may_start(self) -> bool:
        """False when no pending job fits in its pool's free capacity: the pass would start
        nothing (free capacity is necessary, not enough, for a fraction to fit on one GPU).

        In strict arrival order (fifo) only the oldest pending job may start first.
        """
        if self.borrowed:
            return True  # a job within its quota may reclaim borrowed GPUs
        if self.strict_fifo:
            pool, demand = self.demands[next(iter(self.pending))]
            return self.free[pool] >= demand - 1e-9
        demands, free = self.demands, self.free
        return any(free[demands[b][0]] >= demands[b][1] - 1e-9 for b in self.pending)

    def _submit(self, job: Job, wake: bool = True, borrow_after: float = 0.0) -> None:
        if wake and self.quota_model is not None and self.quota_model.borrowing:
            slack = self.policy.reclaim_grace_s - self.policy.reclaim_warning_s
            heapq.heappush(self.wakeups, job.submit + slack)
        self.pending[job.job_id] = Request(
            booking_id=job.job_id,
            user=job.user,
            project=job.project,
            submit_time=job.submit,
            duration_s=predict_run(self.history.get(job.user, ()), job.walltime),
            gpus=job.gpus,
            after=job.after,
            gpu_fraction=job.fraction if self.share(job) < 1 else None,
            borrow_after=borrow_after,
        )

    def _finish_until(self, now: float) -> list[Allocation]:
        finished = []
        last = self.policy.predict_last
        while self.ends and self.ends[0][0] <= now:
            _, job_id, run = heapq.heappop(self.ends)
            if run != self.runs.get(job_id) or job_id not in self.running:
                continue  # the end of a run that was reclaimed
            finished.append(self.running.pop(job_id))
            self.borrowed.discard(job_id)
            job = self.by_id[job_id]
            self.outcomes[job_id] = OUTCOME_NOT_OK if job.failed else OUTCOME_OK
            pool, demand = self._demand(job)
            self.free[pool] += demand
            if last:
                runs = self.history.setdefault(job.user, deque(maxlen=last))
                runs.append(min(job.duration, job.walltime))
        return finished

    def _decay(self, now: float, finished: list[Allocation]) -> None:
        """Fair-share usage at ``now``, kept incrementally with the allocator's own decay rule."""
        half_life = self.policy.fairshare_half_life_s
        self.usage = carry_usage(self.usage, now - self.usage_time, half_life)
        records = [(a.project, a.start, now, len(a.device_ids) * a.share) for a in finished]
        for project, value in decay_usage(records, now, half_life).items():
            self.usage[project] = self.usage.get(project, 0.0) + value
        self.usage_time = now

    def _running_usage(self, now: float) -> dict[str, float]:
        records = [
            (a.project, a.start, now, len(a.device_ids) * a.share) for a in self.running.values()
        ]
        live = decay_usage(records, now, self.policy.fairshare_half_life_s)
        return {p: self.usage.get(p, 0.0) + live.get(p, 0.0) for p in self.projects}

    def _allocations(self, now: float) -> tuple[Allocation, ...]:
        """Running jobs; one past its predicted end is planned to its walltime from now on."""
        out = []
        for alloc in self.running.values():
            if alloc.end <= now:
                alloc = replace(alloc, end=alloc.start + self.by_id[alloc.booking_id].walltime)
            out.append(alloc)
        return tuple(out)

    def _show(self, state: State, submitted: list[str]) -> None:
        """Record the planned start shown to the bookings just submitted, by a pass on the state
        that decides this instant's starts: for one booking the walk up to it is enough
        (``plan(until=...)``, as the portal's estimate)."""
        until = submitted[0] if len(submitted) == 1 else None
        fresh = set(submitted)
        for line in plan(state, self.policy, until=until).planned:
            if line.booking_id in fresh:
                self.shown[line.booking_id] = line.start

    def _state(self, now: float) -> State:
        return State(
            now=now,
            devices=self.devices,
            allocations=self._allocations(now),
            pending=tuple(self.pending.values()),
            project_shares={project: 1.0 for project in self.projects},
            project_usage=self._running_usage(now) if self.policy.weight_fairshare else {},
            project_quotas=self.project_quotas,
            outcomes=self.outcomes,
        )

    def _schedule(self, state: State) -> None:
        # Only the starts matter here (the planned starts shown come from _show). A pass that
        # reclaims is followed by one at the same instant, which starts the reclaiming jobs.
        while self._pass(state):
            state = self._state(state.now)

    def _reclaim(self, now: float, preemptions) -> None:
        """Stop the reclaimed jobs and queue them again with their submit time."""
        for preemption in preemptions:
            job = self.by_id[preemption.booking_id]
            alloc = self.running.pop(job.job_id)
            self.borrowed.discard(job.job_id)
            self.reclaimed_gpu_s += job.gpus * (now - alloc.start)
            pool, demand = self._demand(job)
            self.free[pool] += demand
            restarts = self.runs[job.job_id]
            later = borrow_backoff(self.policy, now, restarts)
            self._submit(job, wake=False, borrow_after=later)  # over its quota: never reclaims

    def _pass(self, state: State) -> bool:
        """One pass at ``state.now``; whether it reclaimed (another pass is due now)."""
        now = state.now
        result = plan(state, self.policy, starts_only=True)
        self._reclaim(now, result.preemptions)
        for booking_id in result.never_met:
            # Ended by the portal; a job after it sees it as not ended successfully.
            del self.pending[booking_id]
            self.outcomes[booking_id] = OUTCOME_NOT_OK
            self.never_met.append(booking_id)
        for start in result.starts:
            job = self.by_id[start.booking_id]
            request = self.pending.pop(job.job_id)
            # A job that outruns its walltime is stopped there, as the portal would.
            end = now + min(job.duration, job.walltime)
            self.running[job.job_id] = Allocation(
                job.job_id,
                start.device_ids,
                now,
                now + request.duration_s,
                job.user,
                job.project,
                share=start.share,
                gpu_memory_mib=start.gpu_memory_mib,
                preemptible=start.borrowed,
                borrowed=start.borrowed,
            )
            if start.borrowed:
                self.borrowed.add(job.job_id)
            self.last_borrowed[job.job_id] = start.borrowed
            self.started[job.job_id] = now
            pool, demand = self._demand(job)
            self.free[pool] -= demand
            self.runs[job.job_id] = run = self.runs.get(job.job_id, 0) + 1
            heapq.heappush(self.ends, (end, job.job_id, run))
        return bool(result.preemptions)


def metrics(replay: Replay, policy_name: str, gpus: int, project_column: str | None) -> dict:
    """The JSON line: waits, job completion time, bounded slowdown, utilization, makespan."""
    jobs = [job for job in replay.jobs if job.job_id in replay.started]
    runs = [min(job.duration, job.walltime) for job in jobs]
    waits = [replay.started[job.job_id] - job.submit for job in jobs]
    jcts = [wait + run for wait, run in zip(waits, runs, strict=True)]
    bslds = [max(1.0, jct / max(run, BSLD_BOUND_S)) for jct, run in zip(jcts, runs, strict=True)]
    # GPU-equivalents asked: a notebook's fraction, even where it holds a whole GPU.
    busy = sum(job.gpus * job.fraction * run for job, run in zip(jobs, runs, strict=True))
    first = min((job.submit for job in jobs), default=0.0)
    makespan = max((job.submit + jct for job, jct in zip(jobs, jcts, strict=True)), default=0.0)
    makespan -= first
    out = {
        "policy": policy_name,
        "jobs": len(jobs),
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
    if replay.track_planned:
        # Jobs that did not start at their submission: |planned start shown then - real start|.
        errors = [
            abs(replay.shown[job.job_id] - replay.started[job.job_id])
            for job in jobs
            if replay.shown.get(job.job_id) is not None and replay.shown[job.job_id] > job.submit
        ]
        out["planned_start_error_p50_s"] = _percentile(errors, 50)
        out["planned_start_error_p90_s"] = _percentile(errors, 90)
        out["planned_start_errors"] = len(errors)
    if project_column:
        out["projects"] = _projects(jobs, runs, waits)
    if any(job.after for job in replay.jobs):
        out["dependency_never"] = len(replay.never_met)
    if replay.quota_model is not None:
        out.update(_quota_metrics(replay, jobs, runs, waits))
    return out


def _quota_metrics(replay: Replay, jobs: list[Job], runs: list[float], waits: list[float]):
    """The quota model's figures: within-quota waits apart, borrowed and reclaimed GPU-hours."""
    lent = [replay.last_borrowed.get(job.job_id, False) for job in jobs]
    within = [wait for wait, borrowed in zip(waits, lent, strict=True) if not borrowed]
    borrowed_s = sum(job.gpus * run for job, run, b in zip(jobs, runs, lent, strict=True) if b)
    return {
        "quotas": replay.quota_model.label,
        "quota_limit_gpus": replay.quota_model.limit(replay.capacity),
        "quota_refused": replay.quota_refused,
        "never_started": len(replay.jobs) - len(jobs),
        "within_jobs": len(within),
        "within_mean_wait_s": _mean(within),
        "within_p95_wait_s": _percentile(within, 95),
        "within_p99_wait_s": _percentile(within, 99),
        "borrowed_jobs": len(jobs) - len(within),
        "borrowed_gpu_hours": borrowed_s / 3600.0,
        "reclaims": sum(replay.runs.values()) - len(jobs),
        "reclaimed_gpu_hours": replay.reclaimed_gpu_s / 3600.0,
    }


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
    *,
    factor_range: tuple[float, float] | None = None,
    seed: int = 0,
    half: str | None = None,
    track_planned: bool = False,
    quotas: QuotaModel | None = None,
) -> dict:
    """Run one replay and return its metrics (what the command line prints)."""
    jobs = load_jobs(
        path, estimate_factor, project_column, factor_range=factor_range, seed=seed, half=half
    )
    chosen = policy_override or POLICIES[policy]
    replay = Replay(jobs, cluster(gpus, gpus_per_node), chosen, track_planned, quotas)
    replay.run()
    return metrics(replay, policy, gpus, project_column)


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(
        prog="python -m scheduler.replay", description=__doc__.splitlines()[0]
    )
    parser.add_argument("trace", nargs="?")
    parser.add_argument("--gpus", type=int)
    parser.add_argument("--gpus-per-node", type=int, default=8)
    parser.add_argument("--estimate-factor", type=float, default=1.0)
    parser.add_argument("--policy", choices=sorted(POLICIES), default="portal")
    parser.add_argument("--project-column", default=None)
    parser.add_argument("--quotas", default=None, help="NxS: N projects, each S x the GPUs")
    parser.add_argument("--borrowing", action="store_true", help="the --quotas limits lend")
    parser.add_argument(
        "--half", choices=("first", "second"), help="the jobs of that half of the submit span"
    )
    parser.add_argument(
        "--notebook-share",
        type=float,
        help="this share of the 1-GPU jobs ask a GPU fraction; replayed shared and exclusive",
    )
    parser.add_argument(
        "--shared-nodes", type=int, default=1, help="nodes in sharing mode (--notebook-share)"
    )
    parser.add_argument("--seed", type=int, default=0, help="the notebook generator's seed")
    parser.add_argument(
        "--fractions-from",
        help="pod trace whose fractions notebooks draw from (openb_gpushare.csv beside TRACE)",
    )
    parser.add_argument(
        "--sweep",
        action="store_true",
        help="the whole table: every shared trace x 5 sizes x 2 walltime models (see sweep.py)",
    )
    argv = sys.argv[1:] if argv is None else list(argv)
    if "--sweep" in argv:
        from scheduler.sweep import main as sweep_main

        return sweep_main([arg for arg in argv if arg != "--sweep"])
    args = parser.parse_args(argv)
    if args.trace is None or args.gpus is None:
        parser.error("a trace and --gpus are required (or --sweep)")
    if args.notebook_share is not None:
        from scheduler.notebooks import command

        return command(parser, args)
    quotas = None
    if args.quotas:
        try:
            quotas = parse_quota_model(args.quotas, borrowing=args.borrowing)
        except ValueError as error:
            parser.error(f"--quotas: {error}")
    result = replay_trace(
        args.trace,
        args.gpus,
        args.policy,
        args.gpus_per_node,
        args.estimate_factor,
        args.project_column,
        half=args.half,
        quotas=quotas,
    )
    sys.stdout.write(json.dumps(result) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
