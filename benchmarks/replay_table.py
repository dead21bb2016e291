"""Side-by-side replay of fifo, easy and portal; prints markdown tables for docs/scheduling.md.

    python benchmarks/replay_table.py [--trace ../shared/traces/public_a.csv] [--gpus 80 88]
        [--philly ../shared/traces/philly_vc_a.csv --philly-gpus 560]

Every row is a real run of ``scheduler.replay`` (the same ``plan()`` the workers call). The
targets line compares portal with easy at each size: mean wait <= 0.5x, p99 and max wait <=,
utilization >=.
"""

from __future__ import annotations

import argparse
import sys
from multiprocessing import Pool
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from scheduler.replay import replay_trace  # noqa: E402

POLICIES = ("fifo", "easy", "portal")
COLUMNS = ("mean_wait_s", "p50_wait_s", "p95_wait_s", "p99_wait_s", "max_wait_s", "mean_jct_s")


def _run(args: tuple) -> dict:
    trace, gpus, policy, project_column = args
    return replay_trace(trace, gpus, policy, project_column=project_column)


def replay_rows(trace: str, sizes: list[int], project_column: str | None = None) -> list[dict]:
    """All policies at all sizes, two at a time."""
    jobs = [(trace, gpus, policy, project_column) for gpus in sizes for policy in POLICIES]
    with Pool(2) as pool:
        return pool.map(_run, jobs)


def table(rows: list[dict]) -> str:
    """The markdown table of the rows."""
    head = "| GPUs | policy | " + " | ".join(COLUMNS) + " | mean_bsld | utilization | makespan_s |"
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for row in rows:
        cells = [f"{row[c]:,.0f}" for c in COLUMNS]
        lines.append(
            f"| {row['gpus']} | {row['policy']} | "
            + " | ".join(cells)
            + f" | {row['mean_bsld']:.2f} | {row['utilization']:.4f} | {row['makespan_s']:,.0f} |"
        )
    return "\n".join(lines)


def targets(rows: list[dict]) -> str:
    """One line per size: does portal meet each target against easy?"""
    out = []
    for gpus in sorted({row["gpus"] for row in rows}):
        easy = next(r for r in rows if r["gpus"] == gpus and r["policy"] == "easy")
        portal = next(r for r in rows if r["gpus"] == gpus and r["policy"] == "portal")
        checks = {
            "mean <= 0.5x easy": portal["mean_wait_s"] <= 0.5 * easy["mean_wait_s"],
            "p99 <= easy": portal["p99_wait_s"] <= easy["p99_wait_s"],
            "max <= easy": portal["max_wait_s"] <= easy["max_wait_s"],
            "util >= easy": portal["utilization"] >= easy["utilization"],
        }
        ratio = portal["mean_wait_s"] / easy["mean_wait_s"] if easy["mean_wait_s"] else 0.0
        marks = ", ".join(f"{name}: {'yes' if ok else 'NO'}" for name, ok in checks.items())
        out.append(f"- {gpus} GPUs: portal/easy mean wait = {ratio:.2f}; {marks}")
    return "\n".join(out)


def projects_table(rows: list[dict]) -> str:
    """Per-project GPU-hours (and fraction of all) against an equal share, and mean wait."""
    names = sorted(rows[0]["projects"])
    head = "| project | jobs | share | " + " | ".join(
        f"{r['policy']}: GPU-h (fraction), mean wait s" for r in rows
    )
    lines = [head + " |", "|" + "---|" * (head.count("|"))]
    for name in names:
        cells = []
        for row in rows:
            total = sum(p["gpu_hours"] for p in row["projects"].values()) or 1.0
            project = row["projects"][name]
            hours = project["gpu_hours"]
            cells.append(f"{hours:,.1f} ({hours / total:.3f}), {project['mean_wait_s']:,.0f}")
        first = rows[0]["projects"][name]
        lines.append(
            f"| {name} | {first['jobs']} | {first['share']:.3f} | " + " | ".join(cells) + " |"
        )
    return "\n".join(lines)


def main() -> int:
    """Run and print."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--trace", default="../shared/traces/public_a.csv")
    parser.add_argument("--gpus", type=int, nargs="+", default=[80, 88])
    parser.add_argument("--philly", default=None)
    parser.add_argument("--philly-gpus", type=int, nargs="+", default=[560])
    args = parser.parse_args()
    rows = replay_rows(args.trace, args.gpus)
    print(f"### {Path(args.trace).name}\n\n{table(rows)}\n\n{targets(rows)}\n")
    if args.philly:
        for gpus in args.philly_gpus:
            rows = replay_rows(args.philly, [gpus], project_column="vc")
            name = Path(args.philly).name
            print(f"### {name} at {gpus} GPUs, project = vc, equal shares\n\n{table(rows)}\n")
            print(projects_table(rows) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
