"""Scale benchmark of the pure allocator: one ``plan()`` over the generated site.

    python benchmarks/bench_allocator.py [--repeat 5] [--seed 1] [--pending 10000] [--gpus 1024]
        [--topology] [--windows N] [--shared-nodes 0] [--fractional 0] [--holds N]

The site is benchmarks/sitegen.py's, the same one bench_pass.py writes into PostgreSQL: 1,024
GPUs in 128 nodes (four models, two nodes in MIG mode), ~95 % of the devices running, 100
advance reservations, 10,000 pending bookings with durations to the second and widths from a
MIG slice to 64 GPUs, 300 users in 40 projects with a quota and a GPU-hour budget on every user
and project. ``--shared-nodes N --fractional F`` (sitegen.with_shared) adds N nodes of shared
GPUs running fractions and F pending bookings asking a fraction of one shared GPU. Prints the
pass's size and the best and median wall time of ``--repeat`` passes, then one JSON line with
them and calib_s (benchmarks/calib.py). ``--holds N`` adds N weekly
project reservations of 8 GPUs (projects proj00.., windows of two hours from 1 h on, one an hour
after the other), expanded by ``scheduler.holds.expand`` as the portal's snapshot does.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from calib import calib_s  # noqa: E402
from sitegen import Site, generate, with_shared, with_topology  # noqa: E402

from scheduler import Allocation, Device, Policy, Quota, Request, State, plan  # noqa: E402
from scheduler.holds import HoldRule, expand  # noqa: E402
from scheduler.types import NodeResources, Window  # noqa: E402

NOW = 1_000_000_000.0
SHARED_MEMORY_MIB = 81920  # the shared GPUs are A100-80GB


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
        **_share(booking.gpu_fraction),
    )


def _share(fraction: float | None) -> dict:
    """A running fraction's share and memory (a compute share f holds f of the memory)."""
    if fraction is None:
        return {}
    return {"share": fraction, "gpu_memory_mib": int(fraction * SHARED_MEMORY_MIB)}


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
            shared=d.shared,
            memory_mib=SHARED_MEMORY_MIB if d.shared else 0,
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
            gpu_fraction=b.gpu_fraction,
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


def with_windows(state: State, count: int) -> State:
    """``count`` maintenance windows of 2 h on 4 nodes each (every 7th node on), hourly."""
    nodes = sorted({d.node for d in state.devices})
    windows = tuple(
        Window(
            f"w{i}",
            "bench",
            NOW + 3600.0 * i,
            NOW + 3600.0 * (i + 2),
            tuple(nodes[(7 * (4 * i + k)) % len(nodes)] for k in range(4)),
        )
        for i in range(count)
    )
    return replace(state, windows=windows)


def build_state(
    seed: int, pending: int = 10_000, gpus: int = 1024, shared_nodes: int = 0, fractional: int = 0
) -> State:
    """The benchmark State (deterministic for a seed)."""
    site = generate(pending=pending, gpus=gpus, seed=seed)
    if shared_nodes or fractional:
        site = with_shared(site, shared_nodes=shared_nodes, fractional=fractional, seed=seed)
    return state_of(site)


def with_holds(state: State, count: int) -> State:
    """``state`` with ``count`` weekly project reservations of 8 GPUs (see the module)."""
    rules = tuple(
        HoldRule(
            f"r{i}", f"proj{i:02d}", NOW + 3600 * (i + 1), NOW + 3600 * (i + 3), 8, weekly=True
        )
        for i in range(count)
    )
    holds = expand(rules, state.devices, state.allocations, NOW)
    return replace(state, holds=holds)


def with_cpus(state: State, seed: int) -> State:
    """``state`` with 96 cores and 1 TiB on every node (8 GPUs' worth) and random cores and
    memory on every request and allocation (a third of each left at the default)."""
    rng = random.Random(seed)
    nodes = sorted({d.node for d in state.devices})
    resources = {node: NodeResources(96, 1024 * 1024, 8) for node in nodes}

    def asked() -> dict:
        cpus = rng.choice([None, 4, 8, 12, 16, 24])
        memory = rng.choice([None, 32_768, 65_536, 131_072, 196_608])
        return {"cpus": cpus, "memory_mib": memory}

    pending = tuple(replace(r, **asked()) for r in state.pending)
    allocations = tuple(replace(a, **asked()) for a in state.allocations)
    return replace(state, pending=pending, allocations=allocations, node_resources=resources)


def _time(state: State, repeat: int) -> tuple[list[float], object]:
    times = []
    for _ in range(repeat):
        began = time.perf_counter()
        result = plan(state, Policy())
        times.append(time.perf_counter() - began)
    return times, result


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
    parser.add_argument(
        "--windows",
        type=int,
        default=0,
        help="maintenance windows of 2 h, each on 4 nodes, one starting every hour from now",
    )
    parser.add_argument(
        "--shared-nodes", type=int, default=0, help="more nodes of 8 shared GPUs running fractions"
    )
    parser.add_argument(
        "--fractional", type=int, default=0, help="more pending bookings asking a GPU fraction"
    )
    parser.add_argument("--holds", type=int, default=0, help="weekly project reservations")
    parser.add_argument(
        "--cpus",
        action="store_true",
        help="96 cores and 1 TiB per node, random cores and memory per booking; "
        "times the plain pass beside it",
    )
    args = parser.parse_args()
    if args.fractional and not args.shared_nodes:
        parser.error("--fractional needs --shared-nodes: fractions only go to shared GPUs")
    calib = calib_s()
    state = build_state(args.seed, args.pending, args.gpus, args.shared_nodes, args.fractional)
    if args.topology:
        state = with_topology(state)
    if args.windows:
        state = with_windows(state, args.windows)
    if args.holds:
        state = with_holds(state, args.holds)
    plain = None
    if args.cpus:
        plain, _ = _time(state, args.repeat)
        state = with_cpus(state, args.seed)
    times, result = _time(state, args.repeat)
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
        "shared_nodes": args.shared_nodes,
        "fractional": args.fractional,
        "holds": len(state.holds),
        "plan_best_s": round(min(times), 3),
        "plan_median_s": round(statistics.median(times), 3),
        "calib_s": calib,
    }
    if plain is not None:
        summary["plain_best_s"] = round(min(plain), 3)
        summary["plain_median_s"] = round(statistics.median(plain), 3)
        summary["cpus_over_plain"] = round(min(times) / min(plain), 3)
        print(
            f"plain (no cores/memory): best {min(plain):.3f} s; ratio {min(times) / min(plain):.3f}"
        )
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
