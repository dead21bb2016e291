"""Scale benchmark: one allocation pass over a large synthetic site.

    python benchmarks/bench_allocator.py [--repeat 5] [--seed 1]

128 nodes of 8 GPUs (1,024 GPUs): 112 nodes of whole GPUs, 8 nodes with every GPU split into
7 x 1g.10gb, 8 nodes with every GPU split into 3g.40gb + 3g.40gb + 1g.10gb. 2,000 allocations
(running ones plus advance reservations), 10,000 pending bookings of 1-32 GPUs or one MIG
instance, durations on whole hours (1-48 h), 200 users in 20 projects, a few with quotas.
Prints the pass's size and the best and median wall time of ``--repeat`` passes.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from scheduler import Allocation, Device, Policy, Quota, Request, State, plan  # noqa: E402

HOUR = 3600.0
NOW = 1_000_000.0


def devices() -> tuple[Device, ...]:
    """The 1,024-GPU inventory."""
    out = []
    for n in range(128):
        node = f"node{n:03d}"
        for g in range(8):
            gpu, temp = f"{node}-gpu{g}", 30.0 + (n * 8 + g) % 40
            if n < 112:
                out.append(Device(gpu, node, "A100", temperature_c=temp))
                continue
            layout = ["1g.10gb"] * 7 if n < 120 else ["3g.40gb", "3g.40gb", "1g.10gb"]
            for k, profile in enumerate(layout):
                slices = int(profile[0])
                out.append(
                    Device(
                        f"{gpu}-mig{k}",
                        node,
                        "A100",
                        profile,
                        slices / 7,
                        temperature_c=temp,
                        parent=gpu,
                    )
                )
    return tuple(out)


def allocations(inventory, rng: random.Random, count: int = 2000) -> tuple[Allocation, ...]:
    """``count`` allocations: 70 % running (one device each, ending within 25 h), the rest
    advance reservations 30-90 h ahead on distinct devices (so nothing overlaps)."""
    out, free = [], list(inventory)
    rng.shuffle(free)
    running = int(count * 0.7)
    for i in range(running):
        device = free.pop()
        end = NOW + rng.choice([1, 2, 3, 6, 12, 24]) * HOUR + rng.randint(0, 3599)
        user = f"user{rng.randrange(200):03d}"
        out.append(
            Allocation(
                f"run{i}",
                (device.id,),
                NOW - HOUR,
                end,
                user,
                f"proj{int(user[4:]) % 20:02d}",
                qos=rng.choice(["low", "normal"]),
                preemptible=rng.random() < 0.3,
            )
        )
    for i, device in enumerate(rng.sample(inventory, count - running)):
        start = NOW + rng.randint(30, 90) * HOUR
        out.append(
            Allocation(
                f"adv{i}", (device.id,), start, start + 4 * HOUR, "admin", "ops", running=False
            )
        )
    return tuple(out)


def pending(rng: random.Random, count: int = 10_000) -> tuple[Request, ...]:
    """Pending bookings: mostly small whole-GPU requests, some MIG, a few whole-node ones."""
    out = []
    for i in range(count):
        user = f"user{rng.randrange(200):03d}"
        kind = rng.random()
        gpus, profile = 1, None
        if kind < 0.15:
            profile = "1g.10gb" if kind < 0.10 else "3g.40gb"
        else:
            gpus = rng.choices([1, 2, 4, 8, 16, 32], weights=[55, 15, 12, 12, 4, 2])[0]
        out.append(
            Request(
                f"b{i:05d}",
                user,
                f"proj{int(user[4:]) % 20:02d}",
                NOW - rng.randint(0, 7 * 86400),
                rng.choice([1, 2, 4, 8, 12, 24, 48]) * HOUR,
                gpus=gpus,
                mig_profile=profile,
                qos=rng.choices(["low", "normal", "high"], weights=[20, 75, 5])[0],
            )
        )
    return tuple(out)


def build_state(seed: int) -> State:
    """The benchmark State (deterministic for a seed)."""
    rng = random.Random(seed)
    inventory = devices()
    quotas = {f"user{u:03d}": Quota(max_gpus=16.0) for u in range(0, 200, 20)}
    return State(
        NOW,
        inventory,
        allocations(inventory, rng),
        pending(rng),
        project_shares={f"proj{p:02d}": 1.0 + p % 3 for p in range(20)},
        project_usage={f"proj{p:02d}": 1e6 * (p % 5) for p in range(20)},
        user_quotas=quotas,
        project_quotas={"proj07": Quota(max_gpus=200.0)},
    )


def main() -> int:
    """Time ``--repeat`` passes and print the size and timings."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    state = build_state(args.seed)
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
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
