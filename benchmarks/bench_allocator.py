"""Scale benchmark of the pure allocator: one ``plan()`` over the generated site.

    python benchmarks/bench_allocator.py [--repeat 5] [--seed 1] [--pending 10000] [--gpus 1024]

The site is benchmarks/sitegen.py's, the same one bench_pass.py writes into PostgreSQL: 1,024
GPUs in 128 nodes (four models, two nodes in MIG mode), ~95 % of the devices running, 100
advance reservations, 10,000 pending bookings with durations to the second and widths from a
MIG slice to 64 GPUs, 300 users in 40 projects with a quota and a GPU-hour budget on every user
and project. Prints the pass's size and the best and median wall time of ``--repeat`` passes,
then one JSON line with them and calib_s (benchmarks/calib.py).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from calib import calib_s  # noqa: E402
from sitegen import Site, generate, with_topology  # noqa: E402

from scheduler import Allocation, Device, Policy, Quota, Request, State, plan  # noqa: E402

NOW = 1_000_000_000.0


def _user(site: Site, user: int) -> str:
    return f"user{user:03d}@proj{site.user_project[user]:02d}"


def _allocation(site: Site, booking, running: bool) -> Allocation:
    start = NOW + booking.start_in_s
    return Allocation(
        booking.key,
        tuple(sorted(booking.devices)),
        start,
        start + booking.duration_s,
        _user(site, booking.user),
        f"proj{booking.project:02d}",
        qos=booking.qos,
        preemptible=booking.preemptible,
        running=running,
    )


def state_of(site: Site) -> State:
    """The generated site as the allocator's input."""
    devices = tuple(
        Device(
            d.id,
            f"node{d.node:04d}",
            d.model,
            d.profile,
            d.fraction,
            temperature_c=30.0 + (d.node * 8 + d.gpu) % 40,
            parent=f"n{d.node}g{d.gpu}" if d.profile else "",
        )
        for d in site.devices
    )
    allocations = tuple(_allocation(site, b, True) for b in site.running) + tuple(
        _allocation(site, b, False) for b in site.reservations
    )
    pending = tuple(
        Request(
            b.key,
            _user(site, b.user),
            f"proj{b.project:02d}",
            NOW - b.submitted_ago_s,
            float(b.duration_s),
            gpus=b.gpus,
            mig_profile=b.mig_profile,
            gpu_model=b.gpu_model,
            qos=b.qos,
            preemptible=b.preemptible,
        )
        for b in site.pending
    )
    rng = random.Random(7)
    return State(
        NOW,
        devices,
        allocations,
        pending,
        project_shares={f"proj{p:02d}": q[2] for p, q in enumerate(site.project_quotas)},
        project_usage={f"proj{p:02d}": 1e6 * rng.random() for p in range(site.projects)},
        user_quotas={
            _user(site, u): Quota(max_gpus=m, gpu_hours_budget=b, gpu_hours_used=b * 0.3)
            for u, (m, b) in enumerate(site.user_quotas)
        },
        project_quotas={
            f"proj{p:02d}": Quota(max_gpus=m, gpu_hours_budget=b, gpu_hours_used=b * 0.3)
            for p, (m, b, _) in enumerate(site.project_quotas)
        },
    )


def build_state(seed: int, pending: int = 10_000, gpus: int = 1024) -> State:
    """The benchmark State (deterministic for a seed)."""
    return state_of(generate(pending=pending, gpus=gpus, seed=seed))


def main() -> int:
    """Time ``--repeat`` passes and print the size and timings."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--pending", type=int, default=10_000)
    parser.add_argument("--gpus", type=int, default=1024)
    parser.add_argument(
        "--topology",
        action="store_true",
        help="every other 8-GPU node with cube-mesh NVLink and two NUMA domains, racks of 4",
    )
    args = parser.parse_args()
    calib = calib_s()
    state = build_state(args.seed, args.pending, args.gpus)
    if args.topology:
        state = with_topology(state)
    times = []
    for _ in range(args.repeat):
        began = time.perf_counter()
        result = plan(state, Policy())
        times.append(time.perf_counter() - began)
    gpus = len({d.parent or d.id for d in state.devices})
    planned = sum(1 for line in result.planned if line.start is not None)
    reasons: dict[str, int] = {}
    for line in result.planned:
        reasons[line.reason] = reasons.get(line.reason, 0) + 1
    print(
        f"pass: {len(state.pending)} pending, {gpus} GPUs ({len(state.devices)} devices, "
        f"{len({d.node for d in state.devices})} nodes), {len(state.allocations)} allocations"
    )
    print(
        f"result: {len(result.starts)} start now, {planned} with a planned start, "
        f"{len(result.preemptions)} preemptions; reasons {dict(sorted(reasons.items()))}"
    )
    print(
        f"time: best {min(times):.3f} s, median {statistics.median(times):.3f} s"
        f" over {len(times)} passes"
    )
    summary = {
        "bench": "allocator",
        "pending": len(state.pending),
        "gpus": gpus,
        "topology": args.topology,
        "plan_best_s": round(min(times), 3),
        "plan_median_s": round(statistics.median(times), 3),
        "calib_s": calib,
    }
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
