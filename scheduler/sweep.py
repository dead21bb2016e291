"""The policy sweep: every shared trace with a full arrival log x five cluster sizes x two
walltime models, replayed under portal, EASY, FIFO and the reference policies; markdown tables of
ratios to EASY and of the frontier.

    python -m scheduler.replay --sweep [--traces DIR] [--only public_a,philly_vc_a] [--half first]
        [--workers 2] [--predict] [--set field=value ...] [--policies fifo,sjf-easy,...]
        [--loads 1,0.85,0.7] [--no-shown] [--json FILE]
    python -m scheduler.replay --sweep --quotas 4x0.25 [--only ...] [--loads ...]

``--quotas NxS`` replays the public traces under that quota model without and with borrowing
instead (scheduler/quota_sweep.py).

Sizes: the trace's mean demand (offered GPU-seconds / submit span) divided by an offered load of
100, 92.5, 85, 77.5 and 70 %, rounded to a whole GPU (never narrower than the widest job); nodes
of 8 GPUs, the last one possibly smaller.
Walltime models: "exact" (the allocator is told the run time) and "x1-4" (requested = run time x
U(1, 4) rounded up to the hour, seeded per job). Targets per row: portal mean wait <= 0.5x EASY,
p99 <= 1.0x, max <= 1.0x, utilization >= 1.0x. Per row the table names each other policy that
dominates portal (scheduler/frontier.py) and the error of the planned start shown at submission
by portal and by EASY (both replayed with every planned start worked out: the same decisions;
``--no-shown`` skips it, for tuning). ``--policies`` narrows the policies run beside portal and
EASY (default: FIFO and every reference policy). ``--predict`` adds portal with run-time
prediction (``predict_last=2``) on the x1-4 rows and the error of the planned starts it showed.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import json
import os
import sys
import time
from multiprocessing import Pool
from pathlib import Path

from scheduler.frontier import (
    TARGETS,
    closest,
    dominators,
    frontier_table,
    ratios,
    shown_error_cells,
    shown_no_worse,
    starvation_bound,
)
from scheduler.presets import REFERENCE_NAMES
from scheduler.replay import POLICIES, replay_trace
from scheduler.types import Policy

TRACES = {"public_a": None, "public_b": None, "public_c": None, "philly_vc_a": "vc"}
LOADS = (1.0, 0.925, 0.85, 0.775, 0.70)
MODELS = {"exact": None, "x1-4": (1.0, 4.0)}
SEED = 9
# Run beside portal and EASY unless ``--policies`` narrows them.
OTHERS = ("fifo", *REFERENCE_NAMES)


def default_traces_dir() -> Path:
    """$GP_TRACES, else the shared folder next to the checkout (../shared/traces)."""
    if os.environ.get("GP_TRACES"):
        return Path(os.environ["GP_TRACES"])
    return Path(__file__).resolve().parent.parent.parent / "shared" / "traces"


def trace_shape(path: Path, half: str | None = None) -> tuple[float, int]:
    """(mean demand in GPUs = offered GPU-seconds / submit span, widest job) of a trace."""
    rows = []
    with open(path, newline="") as handle:
        for row in csv.DictReader(handle):
            rows.append(
                (float(row["submit_time_s"]), float(row["duration_s"]), int(row["num_gpus"]))
            )
    rows.sort()
    if half is not None:
        middle = (rows[0][0] + rows[-1][0]) / 2.0
        rows = [r for r in rows if (r[0] < middle) is (half == "first")]
    span = rows[-1][0] - rows[0][0]
    offered = sum(duration * gpus for _, duration, gpus in rows)
    return offered / span, max(gpus for _, _, gpus in rows)


def sizes_for(demand: float, widest: int, loads=LOADS) -> list[tuple[int, float]]:
    """(GPUs, offered load) per target load, at least the widest job (8-GPU nodes, the last one
    possibly smaller)."""
    out = []
    for load in loads:
        gpus = max(widest, round(demand / load))
        if all(gpus != seen for seen, _ in out):  # the widest job can make two loads one size
            out.append((gpus, demand / gpus))
    return out


def _run(task: tuple) -> tuple[tuple, dict]:
    key, path, gpus, policy_name, policy, project_column, factor_range, half, track = task
    started = time.perf_counter()
    result = replay_trace(
        str(path),
        gpus,
        policy_name,
        project_column=project_column,
        policy_override=policy,
        factor_range=factor_range,
        seed=SEED,
        half=half,
        track_planned=track,
    )
    result["seconds"] = time.perf_counter() - started
    return key, result


def sweep(
    traces_dir: Path,
    only: list[str] | None = None,
    half: str | None = None,
    portal: Policy | None = None,
    workers: int = 2,
    predict: bool = False,
    loads: tuple[float, ...] | None = None,
    models: tuple[str, ...] | None = None,
    others: tuple[str, ...] = OTHERS,
    shown: bool = True,
) -> list[dict]:
    """Every row of the table, as dicts (row keys plus one metrics dict per policy).

    ``shown``: replay portal and EASY recording the planned start each job was shown at
    submission (EASY with ``estimate_all``, so its bookings past the head get one too).
    """
    loads, models = loads or LOADS, models or tuple(MODELS)
    portal = portal or POLICIES["portal"]
    easy = dataclasses.replace(POLICIES["easy"], estimate_all=shown)
    policies = {"portal": portal, "easy": easy, **{name: POLICIES[name] for name in others}}
    rows, tasks = [], []
    for name, column in TRACES.items():
        if only and name not in only:
            continue
        path = traces_dir / f"{name}.csv"
        demand, widest = trace_shape(path, half)
        for gpus, load in sizes_for(demand, widest, loads):
            for model in models:
                row = {"trace": name, "gpus": gpus, "load": load, "model": model}
                rows.append(row)
                chosen = dict(policies)
                if predict and MODELS[model] is not None:
                    chosen["predict"] = dataclasses.replace(portal, predict_last=2)
                for label, policy in chosen.items():
                    key = (name, gpus, model, label)
                    track = (shown and label in ("portal", "easy")) or label == "predict"
                    track = track or (predict and label == "portal" and MODELS[model] is not None)
                    tasks.append(
                        (key, path, gpus, label, policy, column, MODELS[model], half, track)
                    )
    # Biggest first, so the pool does not end on one long replay.
    tasks.sort(key=lambda t: -_cost(t))
    results = replays_pooled(_run, tasks, workers)
    for row in rows:
        for label in [*policies, "predict"]:
            key = (row["trace"], row["gpus"], row["model"], label)
            if key in results:
                row[label] = results[key]
    return rows


def replays_pooled(run, tasks: list[tuple], workers: int) -> dict:
    """``run(task) -> (key, result)`` over ``tasks`` in a pool of ``workers``: the results by
    key, with a progress line on stderr as each replay ends (a sweep replays many traces for
    many minutes)."""
    results = {}
    with Pool(workers) as pool:
        for key, result in pool.imap_unordered(run, tasks):
            results[key] = result
            print(
                f"[{len(results)}/{len(tasks)}] {' '.join(map(str, key))}"
                f" {result['seconds']:.0f} s",
                file=sys.stderr,
                flush=True,
            )
    return results


def _cost(task: tuple) -> float:
    _, path, gpus, label, *_, track = task
    heavy = label in ("portal", "predict", "conservative") or track
    return path.stat().st_size * (3.0 if heavy else 1.0)


def misses(r: dict[str, float]) -> list[str]:
    """The targets a row of ratios misses, each with its shortfall."""
    out = []
    for name, bound, sense in TARGETS:
        value = r[name]
        if (sense == "<=" and value > bound + 1e-9) or (sense == ">=" and value < bound - 1e-9):
            out.append(f"{name} {value:.3f} (target {sense} {bound})")
    return out


def table(rows: list[dict]) -> str:
    """The markdown table, then one summary line per question: targets, dominance, shown start."""
    head = (
        "| trace | GPUs | load | walltime | EASY mean h | EASY p99 h | EASY max h | EASY util "
        "| portal mean | p99 | max | util | shown-start error p50 h portal / EASY | p90 h "
        "| dominated by | portal misses |"
    )
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    met = dominated = shown = measured = 0
    for row in rows:
        easy = row["easy"]
        mine = ratios(row["portal"], easy)
        beaten = [label for label in dominators(row) if label != "predict"]  # portal's variant
        missed, no_worse = misses(mine), shown_no_worse(row)
        met += not missed
        dominated += bool(beaten)
        measured += no_worse is not None
        shown += bool(no_worse)
        cells = [
            row["trace"],
            str(row["gpus"]),
            f"{row['load']:.0%}",
            row["model"],
            f"{easy['mean_wait_s'] / 3600:.1f}",
            f"{easy['p99_wait_s'] / 3600:.1f}",
            f"{easy['max_wait_s'] / 3600:.1f}",
            f"{easy['utilization']:.3f}",
            *(f"{mine[k]:.2f}" if k != "util" else f"{mine[k]:.3f}" for k in mine),
            *shown_error_cells(row),
            ", ".join(beaten) or "-",
            "; ".join(missed) or "-",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    lines.append(f"portal meets all four targets on {met} of {len(rows)} rows")
    lines.append(f"portal dominated on {dominated} of {len(rows)} rows")
    if measured:
        lines.append(
            f"portal's shown-start error (p50 and p90) no worse than EASY's on {shown} of"
            f" {measured} rows"
        )
    return "\n".join(lines)


def closest_lines(rows: list[dict], policies: dict[str, Policy]) -> list[str]:
    """Every replayed policy's no-starvation bound, and those that keep one ranked by how far they
    are from the target (scheduler/frontier.closest): the point to ship when none escapes
    domination on every row."""
    bounds = {label: starvation_bound(policy) for label, policy in policies.items()}
    lines = [
        "distance to the target (mean <= 0.5x, p99 and max <= 1x EASY): mean and worst row's"
        " shortfall, policies with a no-starvation bound; closest first"
    ]
    for name, mean, worst in closest(rows, bounds):
        lines.append(f"- {name}: {mean:.3f} mean, {worst:.3f} worst row, bound {bounds[name]}")
    unbounded = sorted(name for name, bound in bounds.items() if bound is None)
    if unbounded:
        lines.append(f"- no bound (not candidates): {', '.join(unbounded)}")
    return lines


def predict_table(rows: list[dict]) -> str:
    """Portal with and without run-time prediction on the x1-4 rows, ratios to EASY."""
    head = (
        "| trace | GPUs | without: mean | p99 | max | util | with: mean | p99 | max | util "
        "| shown-start error p50 h without | p90 h | with p50 h | p90 h |"
    )
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for row in rows:
        if "predict" not in row:
            continue
        easy, plain, pred = row["easy"], row["portal"], row["predict"]
        a, b = ratios(plain, easy), ratios(pred, easy)
        cells = [row["trace"], str(row["gpus"])]
        cells += [f"{a[k]:.2f}" for k in a] + [f"{b[k]:.2f}" for k in b]
        cells += [
            f"{plain['planned_start_error_p50_s'] / 3600:.1f}",
            f"{plain['planned_start_error_p90_s'] / 3600:.1f}",
            f"{pred['planned_start_error_p50_s'] / 3600:.1f}",
            f"{pred['planned_start_error_p90_s'] / 3600:.1f}",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def parse_overrides(items: list[str]) -> dict:
    """``field=value`` pairs for Policy, typed by the field's default ("none" for None)."""
    fields = {f.name: f for f in dataclasses.fields(Policy)}
    out = {}
    for item in items:
        name, _, text = item.partition("=")
        if name not in fields:
            raise SystemExit(f"--set: Policy has no field {name!r}")
        default = fields[name].default
        if text.lower() == "none":
            out[name] = None
        elif isinstance(default, bool):
            out[name] = text.lower() in ("1", "true", "yes")
        elif isinstance(default, int) and not isinstance(default, bool):
            out[name] = int(text)
        elif isinstance(default, str):
            out[name] = text
        else:
            out[name] = float(text)
    return out


def main(argv: list[str] | None = None) -> int:
    """``python -m scheduler.replay --sweep``."""
    parser = argparse.ArgumentParser(prog="python -m scheduler.replay --sweep")
    parser.add_argument("--traces", type=Path, default=default_traces_dir())
    parser.add_argument("--only", default="")
    parser.add_argument("--half", choices=("first", "second"), default=None)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--predict", action="store_true")
    parser.add_argument("--set", action="append", default=[], dest="overrides")
    parser.add_argument("--policies", default=",".join(OTHERS))
    parser.add_argument("--loads", default="")
    parser.add_argument("--no-shown", action="store_true")
    parser.add_argument("--json", type=Path, default=None, help="write the rows here too")
    parser.add_argument("--quotas", default="", help="NxS: the quota model table instead")
    args = parser.parse_args(argv)
    loads = tuple(float(x) for x in args.loads.split(",") if x) or None
    if args.quotas:
        from scheduler.quota_sweep import main as quota_main

        return quota_main(
            args, lambda path: sizes_for(*trace_shape(path, args.half), loads or LOADS)
        )
    others = tuple(name for name in args.policies.split(",") if name)
    unknown = [name for name in others if name not in POLICIES or name in ("portal", "easy")]
    if unknown:
        parser.error(f"--policies: unknown {', '.join(unknown)}; choose from {', '.join(OTHERS)}")
    portal = dataclasses.replace(POLICIES["portal"], **parse_overrides(args.overrides))
    started = time.perf_counter()
    rows = sweep(
        args.traces,
        only=[name for name in args.only.split(",") if name] or None,
        half=args.half,
        portal=portal,
        workers=args.workers,
        predict=args.predict,
        loads=tuple(float(x) for x in args.loads.split(",") if x) or None,
        others=others,
        shown=not args.no_shown,
    )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1) + "\n")
    out = [table(rows)]
    if others:
        out += ["", frontier_table(rows)]
        replayed = {"portal": portal, "easy": POLICIES["easy"], **{n: POLICIES[n] for n in others}}
        out += ["", *closest_lines(rows, replayed)]
    if args.predict:
        out += ["", predict_table(rows)]
    out.append(f"\n{len(rows)} rows, {time.perf_counter() - started:.0f} s")
    sys.stdout.write("\n".join(out) + "\n")
    return 0
