"""The estimate's planning in process: a new request on the bench site's 10,000-booking queue.

    python benchmarks/bench_estimate.py [--requests 60] [--every 128] [--seed 1] [--pending 10000]

The site is bench_allocator.py's (benchmarks/sitegen.py). Each request is what bench_http.py's
estimate step sends (one GPU, 10 min to 6 h, a user of the site, submitted now: it ranks near
the end of the queue). Measured with ``time.process_time()`` (CPU, so other work on the machine
counts less), side by side: ``plan(until=...)`` of the queue with the request (what the estimate
did), the kept walk's one-off build (``keep_walk``, once per shared snapshot) and its ``line()``
per request; every line is compared with ``plan(until=...)``'s. Prints one JSON line with
calib_s.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
import tracemalloc
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_allocator import NOW, build_state  # noqa: E402
from calib import calib_s  # noqa: E402

from scheduler import Policy, Request, plan  # noqa: E402
from scheduler.kept_walk import keep_walk  # noqa: E402


def _cpu(call):
    began = time.process_time()
    result = call()
    return time.process_time() - began, result


def _p95(values: list[float]) -> float:
    return sorted(values)[max(0, round(0.95 * len(values)) - 1)]


def main() -> int:
    """Time the estimate's planning both ways and print the figures."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=60)
    parser.add_argument("--until-requests", type=int, default=5)
    parser.add_argument("--every", type=int, default=128)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--pending", type=int, default=10_000)
    parser.add_argument("--gpus", type=int, default=1024)
    args = parser.parse_args()
    calib = calib_s()
    state, policy = build_state(args.seed, args.pending, args.gpus), Policy()
    rng = random.Random(args.seed)
    users = sorted({r.user for r in state.pending})
    requests = []
    for _ in range(args.requests):
        user = rng.choice(users)
        request = Request("0", user, user.split("@")[1], NOW, 600.0 * rng.randrange(1, 36))
        requests.append(request)
    until, builds, lines, positions = [], [], [], []
    for i, request in enumerate(requests):
        queued = replace(state, pending=state.pending + (request,))
        if i < args.until_requests:
            spent, full = _cpu(lambda q=queued: plan(q, policy, until="0"))
            until.append(spent)
            if i == 0:
                spent, kept = _cpu(lambda: keep_walk(state, policy, args.every))
                builds.append(spent)
        spent, line = _cpu(lambda r=request, k=kept: k.line(r))
        lines.append(spent)
        if line is None:
            raise SystemExit(f"request {i} fell back to plan(): {request}")
        if i < args.until_requests and line != full.planned[-1]:
            raise SystemExit(f"request {i}: {line} != {full.planned[-1]}")
        positions.append(line.position)
    del kept
    tracemalloc.start()
    again = keep_walk(state, policy, args.every)  # again, for its memory only
    memory_mb = tracemalloc.get_traced_memory()[0] / 2**20
    tracemalloc.stop()
    del again
    summary = {
        "bench": "estimate",
        "pending": len(state.pending),
        "every": args.every,
        "plan_until_cpu_p50_s": round(statistics.median(until), 3),
        "keep_walk_build_cpu_s": round(builds[0], 3),
        "keep_walk_mb": round(memory_mb, 1),
        "line_cpu_p50_ms": round(1000 * statistics.median(lines), 1),
        "line_cpu_p95_ms": round(1000 * _p95(lines), 1),
        "line_cpu_max_ms": round(1000 * max(lines), 1),
        "position_min": min(positions),
        "calib_s": calib,
    }
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
