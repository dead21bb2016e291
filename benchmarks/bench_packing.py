"""GPU-sharing packing benchmark: the GPUs a placement needs for Alibaba's GPU-sharing pods.

    python benchmarks/bench_packing.py [--trace ../shared/traces/openb_gpushare.csv]
        [--nodes 16] [--gpus-per-node 8] [--half second] [--placers NAME,...]

Replays the pods of openb_gpushare.csv (FGD paper, ATC'23: 2,573 of its 6,203 pods ask 0.05 to
0.81 of one GPU, the others 1 to 8 whole GPUs) through scheduler/packing.py's event loop on a
cluster large enough that no pod waits, once per placer:

- ``allocator-shared``: ``plan()`` on shared GPUs (a fraction pod holds its fraction of a GPU);
- ``first-fit-shared``: the baseline, each pod on the first GPU with room;
- ``allocator-exclusive`` / ``first-fit-exclusive``: every pod holds whole GPUs.

For each it prints the GPUs with at least one tenant (peak, and time-weighted mean over the
replayed span), the nodes in use at the peak, the capacity the pods asked for (the lower bound),
and the stranded capacity: scheduler/fragmentation.py's measure (the FGD paper's fragmentation,
GPU dimension) over the typical workload, in GPU-equivalents and as a share of the GPUs of the
nodes in use. Tuned on one half, reported on the other: the typical workload is the pod-shape mix
of the half not replayed (``--half second`` replays the later half of the pods, in arrival order,
with the earlier half's mix; ``--half all`` replays everything with the whole trace's mix). Prints calib_s
(benchmarks/calib.py) first, then the table, then one JSON line.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from calib import calib_s  # noqa: E402

from scheduler.packing import AllocatorPlacer, FirstFit, cluster, load_pods  # noqa: E402
from scheduler.packing_replay import PackingReplay, pool_workloads  # noqa: E402

# The shared traces sit beside the checkout (../shared) or beside a folder of worktrees.
_CANDIDATES = [up / "shared" / "traces" / "openb_gpushare.csv" for up in ROOT.parents[:2]]
DEFAULT_TRACE = next((path for path in _CANDIDATES if path.exists()), _CANDIDATES[0])
PLACERS = ("allocator-shared", "first-fit-shared", "allocator-exclusive", "first-fit-exclusive")
COLUMNS = (
    ("peak GPUs in use", "peak_gpus_in_use", "{:d}"),
    ("mean GPUs in use", "mean_gpus_in_use", "{:.2f}"),
    ("of them shared", "peak_shared_gpus_in_use", "{:d}"),
    ("peak nodes", "peak_nodes_in_use", "{:d}"),
    ("mean asked", "mean_demand", "{:.2f}"),
    ("peak asked", "peak_demand", "{:.2f}"),
    ("mean stranded", "mean_stranded", "{:.3f}"),
    ("max stranded", "max_stranded", "{:.3f}"),
    ("stranded share", "mean_stranded_share", "{:.2%}"),
    ("waited", "waited", "{:d}"),
    ("s", "seconds", "{:.1f}"),
)
OTHER_HALF = {"first": "second", "second": "first", "all": None}


def run(name: str, pods, mix, nodes: int, gpus_per_node: int, shared_nodes: int) -> dict:
    """One replay: the figures of ``scheduler.packing_replay.PackingResult`` plus its wall time.
    Shared runs have ``shared_nodes`` of the ``nodes`` in sharing mode, exclusive runs none."""
    kind, mode = name.rsplit("-", 1)
    devices = cluster(nodes, gpus_per_node, shared_nodes=shared_nodes if mode == "shared" else 0)
    placer = AllocatorPlacer(devices) if kind == "allocator" else FirstFit(devices)
    workloads = pool_workloads(mix, mode == "shared")
    began = time.perf_counter()
    result = PackingReplay(pods, devices, placer, workloads).run()
    figures = dict(vars(result))
    figures["seconds"] = time.perf_counter() - began
    return figures


def table(rows: dict[str, dict]) -> str:
    """The Markdown table of the runs, one row per placer."""
    head = "| placer | " + " | ".join(title for title, _, _ in COLUMNS) + " |"
    lines = [head, "|" + "---|" * (len(COLUMNS) + 1)]
    for name, figures in rows.items():
        cells = [fmt.format(figures[key]) for _, key, fmt in COLUMNS]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(
        prog="benchmarks/bench_packing.py",
        description=__doc__.splitlines()[0],
    )
    parser.add_argument("--trace", default=str(DEFAULT_TRACE), help="pod trace CSV")
    parser.add_argument("--nodes", type=int, default=16, help="nodes of the cluster (16)")
    parser.add_argument(
        "--shared-nodes",
        type=int,
        default=8,
        help="of them in sharing mode in the shared runs (8); the exclusive runs have none",
    )
    parser.add_argument("--gpus-per-node", type=int, default=8)
    parser.add_argument(
        "--half",
        choices=sorted(OTHER_HALF),
        default="second",
        help="the half replayed; the typical workload comes from the other (default second)",
    )
    parser.add_argument(
        "--placers",
        default=",".join(PLACERS),
        help=f"comma-separated, of {', '.join(PLACERS)} (default all)",
    )
    args = parser.parse_args(argv)
    names = [name for name in args.placers.split(",") if name]
    unknown = sorted(set(names) - set(PLACERS))
    if unknown or not names:
        parser.error(f"--placers: unknown {', '.join(unknown) or '(none given)'}")
    if not 1 <= args.nodes <= 1024 or not 1 <= args.gpus_per_node <= 16:
        parser.error("--nodes must be in [1, 1024] and --gpus-per-node in [1, 16]")
    if not 0 <= args.shared_nodes <= args.nodes:
        parser.error("--shared-nodes must be in [0, --nodes]")
    calib = calib_s()
    print(json.dumps({"calib_s": calib}))
    replayed = None if args.half == "all" else args.half
    pods = load_pods(args.trace, half=replayed)
    mix = load_pods(args.trace, half=OTHER_HALF[args.half])
    fractions = sum(1 for pod in pods if pod.fraction < 1)
    print(
        f"trace: {Path(args.trace).name}, half {args.half}: {len(pods)} pods ({fractions} asking"
        f" a fraction); typical workloads from {len(mix)} pods; cluster {args.nodes} x"
        f" {args.gpus_per_node} GPUs, {args.shared_nodes} nodes shared in the shared runs"
    )
    rows = {
        name: run(name, pods, mix, args.nodes, args.gpus_per_node, args.shared_nodes)
        for name in names
    }
    print(table(rows))
    summary = {
        "bench": "packing",
        "trace": Path(args.trace).name,
        "half": args.half,
        "pods": len(pods),
        "fraction_pods": fractions,
        "gpus": args.nodes * args.gpus_per_node,
        "shared_gpus": args.shared_nodes * args.gpus_per_node,
        "runs": {
            name: {k: _round(v) for k, v in figures.items()} for name, figures in rows.items()
        },
        "calib_s": calib,
    }
    print(json.dumps(summary))
    return 0


def _round(value):
    return round(value, 4) if isinstance(value, float) else value


if __name__ == "__main__":
    raise SystemExit(main())
