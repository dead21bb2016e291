"""Elastic quotas measured: the public traces replayed under a quota model, without and with
borrowing (scheduler/replay_quotas.py, scheduler/borrowing.py).

    python -m scheduler.replay --sweep --quotas 4x0.25 [--only public_a] [--loads 1,0.85]
        [--workers 2] [--json FILE]

Per trace and cluster size (the sweep's sizes, walltime = run time), the portal policy with the
quota model's limits: utilization, mean and p99 wait of every job, of the jobs whose last run
started within their limits ("within"), the share of GPU-hours run borrowed, reclaims and the
GPU-hours they threw away. Jobs wider than their project's limit are refused (as the portal
refuses them at submission) and left out of both replays.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from scheduler.replay import replay_trace
from scheduler.replay_quotas import QuotaModel
from scheduler.sweep import replays_pooled

PUBLIC = ("public_a", "public_b", "public_c")


def _run(task: tuple) -> tuple[tuple, dict]:
    key, path, gpus, model = task
    started = time.perf_counter()
    result = replay_trace(str(path), gpus, "portal", quotas=model)
    result["seconds"] = time.perf_counter() - started
    return key, result


def quota_sweep(
    traces_dir: Path,
    model: QuotaModel,
    sizes,
    only: list[str] | None = None,
    workers: int = 2,
) -> list[dict]:
    """Rows of (trace, GPUs, load) with the replay "without" and "with" borrowing.

    ``sizes(path) -> [(gpus, load), ...]`` gives each trace's cluster sizes."""
    rows, tasks = [], []
    for name in PUBLIC:
        if only and name not in only:
            continue
        path = traces_dir / f"{name}.csv"
        for gpus, load in sizes(path):
            rows.append({"trace": name, "gpus": gpus, "load": load})
            for label, borrowing in (("without", False), ("with", True)):
                chosen = QuotaModel(model.projects, model.share, borrowing)
                tasks.append(((name, gpus, label), path, gpus, chosen))
    results = replays_pooled(_run, tasks, workers)
    for row in rows:
        for label in ("without", "with"):
            row[label] = results[(row["trace"], row["gpus"], label)]
    return rows


def _h(seconds: float) -> str:
    return f"{seconds / 3600:.1f}"


def quota_table(rows: list[dict]) -> str:
    """The markdown table: without and with borrowing side by side."""
    head = (
        "| trace | GPUs | load | limit GPUs | refused | without: util | mean h | p99 h "
        "| with: util | mean h | p99 h | within mean h | within p99 h | borrowed GPU-h "
        "| reclaims | reclaimed GPU-h |"
    )
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for row in rows:
        off, on = row["without"], row["with"]
        cells = [
            row["trace"],
            str(row["gpus"]),
            f"{row['load']:.0%}",
            f"{on['quota_limit_gpus']:g}",
            str(on["quota_refused"]),
            f"{off['utilization']:.3f}",
            _h(off["mean_wait_s"]),
            _h(off["p99_wait_s"]),
            f"{on['utilization']:.3f}",
            _h(on["mean_wait_s"]),
            _h(on["p99_wait_s"]),
            _h(on["within_mean_wait_s"]),
            _h(on["within_p99_wait_s"]),
            f"{on['borrowed_gpu_hours']:.0f}",
            str(on["reclaims"]),
            f"{on['reclaimed_gpu_hours']:.0f}",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(args, sizes) -> int:
    """``python -m scheduler.replay --sweep --quotas SPEC`` (parsed by sweep.main)."""
    from scheduler.replay_quotas import parse_quota_model

    try:
        model = parse_quota_model(args.quotas)
    except ValueError as error:
        raise SystemExit(f"--quotas: {error}") from None
    started = time.perf_counter()
    only = [name for name in args.only.split(",") if name] or None
    rows = quota_sweep(args.traces, model, sizes, only=only, workers=args.workers)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1) + "\n")
    out = [f"quota model {model.label}: utilization, waits, within-quota waits", quota_table(rows)]
    out.append(f"\n{len(rows)} rows, {time.perf_counter() - started:.0f} s")
    sys.stdout.write("\n".join(out) + "\n")
    return 0
