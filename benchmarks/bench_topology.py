"""The allocator benchmark on a site where half the nodes report NVLink topology.

python benchmarks/bench_allocator.py ... is the site without topology; this is the same site
(benchmarks/sitegen.py) with every other node of 8 whole GPUs given DGX-1's cube-mesh NVLink
(two fully connected quads and links i <-> i+4) and two NUMA domains, and the nodes in racks
of four (network groups). Prints one JSON line like bench_allocator's.

python benchmarks/bench_topology.py [--repeat 3] [--seed 1]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_allocator import build_state  # noqa: E402
from calib import calib_s  # noqa: E402

from scheduler import Policy, plan  # noqa: E402


def _cube_mesh(index: int) -> set[int]:
    return {j for j in range(8) if j != index and (j // 4 == index // 4 or j == (index + 4) % 8)}


def with_topology(state):
    """``state`` with cube-mesh NVLink and NUMA on every other 8-GPU node, racks of 4 nodes."""
    by_node: dict[str, list] = {}
    for device in state.devices:
        by_node.setdefault(device.node, []).append(device)
    devices = []
    for number, (_node, members) in enumerate(sorted(by_node.items())):
        group = f"rack{number // 4}"
        whole = len(members) == 8 and all(d.profile is None for d in members)
        if not whole or number % 2:
            devices += [replace(d, group=group) for d in members]
            continue
        ids = [d.id for d in sorted(members, key=lambda d: d.id)]
        for i, device in enumerate(sorted(members, key=lambda d: d.id)):
            links = tuple(ids[j] for j in sorted(_cube_mesh(i)))
            devices.append(replace(device, links=links, numa=i // 4, group=group))
    return replace(state, devices=tuple(devices))


def main() -> int:
    """Time ``--repeat`` passes over the site with topology."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    calib = calib_s()
    state = with_topology(build_state(args.seed))
    times = []
    for _ in range(args.repeat):
        began = time.perf_counter()
        plan(state, Policy())
        times.append(time.perf_counter() - began)
    linked = sum(1 for d in state.devices if d.links)
    summary = {
        "bench": "allocator-topology",
        "nvlink_gpus": linked,
        "plan_best_s": round(min(times), 3),
        "plan_median_s": round(statistics.median(times), 3),
        "calib_s": calib,
    }
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
