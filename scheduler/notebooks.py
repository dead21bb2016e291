"""A notebook-heavy queue made from a public trace: some of its 1-GPU jobs ask a GPU fraction.

    python -m scheduler.replay ../shared/traces/public_a.csv --gpus 80 --notebook-share 0.4
        [--shared-nodes 1] [--seed 0] [--half first|second]
        [--fractions-from ../shared/traces/openb_gpushare.csv]

The public traces (public_*.csv) hold whole-GPU jobs only. ``notebook_jobs`` turns exactly
``round(share * n)`` of the ``n`` 1-GPU jobs into notebooks: jobs asking a fraction of one GPU,
the fraction drawn (with replacement) from the fractions the GPU-sharing pods of
openb_gpushare.csv ask (Alibaba, FGD paper ATC'23: 0.05 to 0.81, most often 0.81, 0.47, 0.32).
Which jobs and which fractions come from one generator seeded by ``seed`` over the jobs in
trace order, so a seed always gives the same queue; submit times and durations stay the trace's.

``notebook_replay`` replays that queue twice on the same cluster: *shared*, the GPUs of
``shared_nodes`` nodes in sharing mode (they take fractions only, the other GPUs whole-GPU jobs
only, as the allocator places them), and *exclusive*, no GPU shared (a notebook holds a whole
GPU). Each gets the replay's metrics, with ``utilization`` counting the GPU-equivalents asked
(a notebook's fraction), ``allocated_utilization`` the GPUs held (a whole GPU for a notebook
when exclusive), and the waits of the notebooks and of the other jobs apart.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from scheduler.packing import load_pods
from scheduler.replay import POLICIES, Job, Replay, _percentile, cluster, load_jobs, metrics


def openb_fractions(path: str) -> tuple[float, ...]:
    """The fractions below 1 that the pods of a pod trace ask, one per pod, in arrival order."""
    fractions = tuple(pod.fraction for pod in load_pods(path) if pod.fraction < 1)
    if not fractions:
        raise ValueError(f"{path}: no pod asks a fraction below 1")
    return fractions


def notebook_jobs(
    jobs: Sequence[Job], share: float, fractions: Sequence[float], seed: int = 0
) -> list[Job]:
    """``jobs`` with ``round(share * n)`` of its ``n`` 1-GPU jobs asking a fraction drawn from
    ``fractions`` (``Job.fraction``); the others unchanged, in the same order."""
    if not 0 <= share <= 1:
        raise ValueError(f"share must be in [0, 1], not {share}")
    if not fractions or not all(0 < f < 1 for f in fractions):
        raise ValueError("fractions must be a non-empty list of values in (0, 1)")
    single = [i for i, job in enumerate(jobs) if job.gpus == 1]
    rng = random.Random(seed)
    chosen = sorted(rng.sample(single, round(share * len(single))))
    out = list(jobs)
    for i in chosen:
        out[i] = replace(out[i], fraction=rng.choice(fractions))
    return out


def notebook_replay(
    path: str,
    gpus: int,
    policy: str,
    *,
    share: float,
    fractions_path: str,
    shared_nodes: int,
    gpus_per_node: int = 8,
    seed: int = 0,
    half: str | None = None,
) -> dict:
    """Replay the notebook-heavy queue shared and exclusive; returns both runs' metrics."""
    if not 0 < shared_nodes * gpus_per_node < gpus:
        raise ValueError("shared_nodes must leave both shared and whole GPUs in the cluster")
    jobs = notebook_jobs(load_jobs(path, half=half), share, openb_fractions(fractions_path), seed)
    out = {
        "notebook_share": share,
        "notebooks": sum(1 for job in jobs if job.fraction < 1),
        "seed": seed,
        "half": half or "all",
        "shared_gpus": shared_nodes * gpus_per_node,
    }
    for mode, shared in (("shared", shared_nodes), ("exclusive", 0)):
        replay = Replay(jobs, cluster(gpus, gpus_per_node, shared), POLICIES[policy])
        replay.run()
        out[mode] = metrics(replay, policy, gpus, None) | _split(replay)
    return out


def _split(replay: Replay) -> dict:
    """Held utilization, and the waits of notebooks and of whole-GPU jobs apart."""
    jobs = [job for job in replay.jobs if job.job_id in replay.started]
    runs = {job.job_id: min(job.duration, job.walltime) for job in jobs}
    held = sum(job.gpus * replay.share(job) * runs[job.job_id] for job in jobs)
    first = min((job.submit for job in jobs), default=0.0)
    last = max((replay.started[job.job_id] + runs[job.job_id] for job in jobs), default=0.0)
    out = {
        "allocated_utilization": held / (replay.capacity * (last - first)) if last > first else 0.0
    }
    for name, group in (("notebook", True), ("whole", False)):
        waits = [replay.started[j.job_id] - j.submit for j in jobs if (j.fraction < 1) is group]
        out[f"{name}_jobs"] = len(waits)
        out[f"{name}_mean_wait_s"] = sum(waits) / len(waits) if waits else 0.0
        out[f"{name}_p95_wait_s"] = _percentile(waits, 95)
    return out


def command(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    """``python -m scheduler.replay ... --notebook-share S``: prints one JSON line."""
    if not 0 <= args.notebook_share <= 1:
        parser.error("--notebook-share must be in [0, 1]")
    if not 0 < args.shared_nodes * args.gpus_per_node < args.gpus:
        parser.error("--shared-nodes must leave both shared and whole GPUs in the cluster")
    fractions = args.fractions_from or str(Path(args.trace).parent / "openb_gpushare.csv")
    result = notebook_replay(
        args.trace,
        args.gpus,
        args.policy,
        share=args.notebook_share,
        fractions_path=fractions,
        shared_nodes=args.shared_nodes,
        gpus_per_node=args.gpus_per_node,
        seed=args.seed,
        half=args.half,
    )
    sys.stdout.write(json.dumps(result) + "\n")
    return 0
