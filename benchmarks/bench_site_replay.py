"""The cost of `manage.py replay_site`: a site's history replayed under every preset.

    python benchmarks/bench_site_replay.py [--bookings 20000] [--gpus 1024] [--days 30]
        [--loads 0.75,1,1.25] [--database-url postgres://postgres@127.0.0.1:5432/gp_bench_history]

It drops and creates the database, writes a site of ``--gpus`` A100s (8 per node), and
``--bookings`` finished bookings submitted over the last ``--days`` (seeded: widths 1-32 GPUs,
most of them small, log-normal run times around an hour, each asking 1-3x what it ran), then
times the service behind the command (``site_replay``: the export, then 10 policies x the loads)
and prints one line per replay and one JSON object with the total and ``calib_s``. Issue 39's
bound: 20,000 bookings on 1,024 GPUs, every preset, in under 10 minutes.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import secrets
import statistics
import sys
import time
from datetime import timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_pass import _recreate_database  # noqa: E402
from calib import calib_s  # noqa: E402

DEFAULT_DB = "postgres://postgres@127.0.0.1:5432/gp_bench_history"
WIDTHS = ((1, 0.5), (2, 0.15), (4, 0.15), (8, 0.14), (16, 0.05), (32, 0.01))


def _seed(bookings: int, gpus: int, days: int, seed: int) -> None:
    from django.contrib.auth import get_user_model
    from django.utils import timezone

    from portal.models import Booking, Gpu, Node, Project

    rng = random.Random(seed)
    now = timezone.now()
    nodes = Node.objects.bulk_create(
        Node(hostname=f"gpu-{i:03d}", state=Node.State.UP) for i in range(-(-gpus // 8))
    )
    Gpu.objects.bulk_create(
        Gpu(
            node=nodes[i // 8],
            index=i % 8,
            uuid=f"GPU-bench-{i:05d}",
            model="A100-80GB",
            memory_mib=81920,
        )
        for i in range(gpus)
    )
    users = get_user_model().objects.bulk_create(
        get_user_model()(username=f"user{i:03d}") for i in range(100)
    )
    projects = Project.objects.bulk_create(Project(slug=f"proj{i:02d}") for i in range(10))
    widths, weights = zip(*WIDTHS, strict=True)
    rows = []
    for i in range(bookings):
        submitted = now - timedelta(seconds=rng.uniform(3600, days * 86400 - 60))
        ran = min(max(60.0, rng.lognormvariate(8.2, 1.2)), 7 * 86400)
        started = submitted + timedelta(seconds=rng.uniform(0, 600))
        user = users[i % len(users)]
        rows.append(
            Booking(
                owner=user,
                project=projects[hash(user.username) % len(projects)],
                gpus=rng.choices(widths, weights)[0],
                duration_s=int(ran * rng.uniform(1.0, 3.0)) + 1,
                submitted_at=submitted,
                started_at=started,
                ended_at=started + timedelta(seconds=ran),
                state=Booking.State.FINISHED,
            )
        )
    Booking.objects.bulk_create(rows, batch_size=2000)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--bookings", type=int, default=20_000)
    parser.add_argument("--gpus", type=int, default=1024)
    parser.add_argument("--days", type=int, default=30)
    parser.add_argument("--loads", default="0.75,1,1.25")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--database-url", default=DEFAULT_DB)
    args = parser.parse_args()
    calib = calib_s()
    _recreate_database(args.database_url)
    os.environ["DATABASE_URL"] = args.database_url
    os.environ.setdefault("SECRET_KEY", "bench-" + secrets.token_urlsafe(32))
    os.environ["DJANGO_SETTINGS_MODULE"] = "portal.settings"
    import django

    django.setup()
    from django.core.management import call_command
    from django.utils import timezone

    from portal.services.reporting.site_replay import site_replay

    call_command("migrate", verbosity=0)
    began = time.perf_counter()
    _seed(args.bookings, args.gpus, args.days, args.seed)
    print(
        f"seeded {args.bookings} bookings on {args.gpus} GPUs in {time.perf_counter() - began:.1f} s"
    )

    def progress(done, total, policy, load, seconds):
        print(f"[{done}/{total}] {policy} at load {load:g}: {seconds:.1f} s", flush=True)

    loads = tuple(float(x) for x in args.loads.split(","))
    began = time.perf_counter()
    result = site_replay(days=args.days, now=timezone.now(), loads=loads, progress=progress)
    total = time.perf_counter() - began
    seconds = [row["seconds"] for row in result.rows]
    summary = {
        "bookings": len(result.trace.rows),
        "gpus": result.gpus,
        "replays": len(result.rows),
        "total_s": round(total, 1),
        "replay_p50_s": round(statistics.median(seconds), 2),
        "replay_max_s": round(max(seconds), 2),
        "utilization_at_1": round(
            next(r["utilization"] for r in result.rows if r["load"] == 1.0), 3
        )
        if 1.0 in loads
        else None,
        "calib_s": calib,
    }
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
