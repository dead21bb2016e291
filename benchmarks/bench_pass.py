"""The whole allocation pass on PostgreSQL at site scale, with people using the API meanwhile.

    python benchmarks/bench_pass.py [--pending 10000] [--gpus 1024] [--passes 8] [--clients 20]
        [--database-url postgres://postgres@127.0.0.1:5432/gp_bench_pass]
        [--redis-url redis://127.0.0.1:6379/9] [--memory-passes 100] [--no-api]
        [--shared-nodes 8 --fractional 2000] [--cpus]

PostgreSQL: --database-url names a database this script drops and creates (default
gp_bench_pass on 127.0.0.1:5432 as user postgres); the server must let that user create
databases. Redis: --redis-url names a database the script flushes (default db 9).

It writes benchmarks/sitegen.py's site (the same as bench_allocator.py's) into the database with
COPY-speed bulk inserts, runs one pass to settle the queue, then starts a real HTTP server
(daphne, the ASGI app as `manage.py up` serves it) and ``--clients`` API clients in a separate
process that submit, cancel, extend and release through the REST API while the real
``allocation_pass`` runs back to back ``--passes`` times. It prints each pass's snapshot, plan,
start and store times, p50/p95 of the whole pass, the worker's peak memory, the API's p95 latency
and its 503 count. ``--memory-passes N`` then runs N more passes and prints the resident memory
after the first tenth and at the end. ``--shared-nodes N --fractional F`` (sitegen.with_shared)
add N nodes of 8 shared GPUs running fractions and F pending bookings asking a fraction of one
shared GPU; run it with ``--fractional 0`` too for the same site without them. The last line is
one JSON object.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import random
import resource
import secrets
import statistics
import subprocess
import sys
import time
from collections import Counter
from datetime import timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from calib import calib_s  # noqa: E402
from sitegen import Site, generate, with_shared  # noqa: E402

DEFAULT_DB = "postgres://postgres@127.0.0.1:5432/gp_bench_pass"
DEFAULT_REDIS = "redis://127.0.0.1:6379/9"
SERVER_LOG = Path("/tmp/bench_pass_server.log")


def _recreate_database(url: str) -> None:
    import psycopg

    name = url.rsplit("/", 1)[1]
    admin = url.rsplit("/", 1)[0] + "/postgres"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')


def _setup_django(args) -> None:
    os.environ["DATABASE_URL"] = args.database_url
    os.environ["REDIS_URL"] = args.redis_url
    os.environ.setdefault("SECRET_KEY", "bench-" + secrets.token_urlsafe(32))
    os.environ["DJANGO_SETTINGS_MODULE"] = "portal.settings"
    # --cpus: the site books cores and memory (off, the pass would count GPUs alone).
    os.environ["SCHEDULE_CORES_MEMORY"] = "1" if args.cpus else "0"
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


# --cpus: cores and host memory per GPU of a node (a DGX-like 8 GPUs: 96 cores, 1 TiB), and
# what bookings ask per node (None: the default, scheduler.resources.node_demand).
CPUS_PER_GPU, MEMORY_MIB_PER_GPU = 12, 128 * 1024
ASKED_CPUS = (None, None, 4, 8, 16)
ASKED_MEMORY_MIB = (None, None, 16 * 1024, 64 * 1024)


def _build(site: Site, clients: int, resources: bool = False) -> list[tuple[str, int, int]]:
    """Write the site; returns (API token, ids of its active bookings) per API client. With
    ``resources``, nodes have cores and memory and bookings ask some (``--cpus``)."""
    from django.contrib.auth import get_user_model
    from django.utils import timezone

    from portal.models import (
        Allocation,
        ApiToken,
        Booking,
        Gpu,
        Membership,
        MigInstance,
        Node,
        NodeHeartbeat,
        Project,
        Quota,
    )
    from portal.models.tokens import hash_token

    now = timezone.now()
    user_model = get_user_model()
    users = user_model.objects.bulk_create(
        user_model(username=f"user{u:03d}", password="!") for u in range(site.users)
    )
    projects = Project.objects.bulk_create(
        Project(slug=f"proj{p:02d}", name=f"Project {p}") for p in range(site.projects)
    )
    Membership.objects.bulk_create(
        Membership(project=projects[site.user_project[u]], user=users[u]) for u in range(site.users)
    )
    Quota.objects.bulk_create(
        [
            Quota(project=projects[p], max_gpus=m, gpu_hours_budget=b, fairshare_shares=s)
            for p, (m, b, s) in enumerate(site.project_quotas)
        ]
        + [
            Quota(
                project=projects[site.user_project[u]],
                user=users[u],
                max_gpus=m,
                gpu_hours_budget=b,
            )
            for u, (m, b) in enumerate(site.user_quotas)
        ]
    )
    per_node = Counter(node for node, _ in {(d.node, d.gpu) for d in site.devices})
    nodes = Node.objects.bulk_create(
        Node(
            hostname=f"node{n:04d}",
            state=Node.State.UP,
            cpus=CPUS_PER_GPU * max(per_node[n], 1) if resources else None,
            memory_mib=MEMORY_MIB_PER_GPU * max(per_node[n], 1) if resources else None,
        )
        for n in range(site.nodes)
    )
    draw = random.Random(site.nodes)
    NodeHeartbeat.objects.bulk_create(NodeHeartbeat(node=node, last_seen=now) for node in nodes)
    gpu_rows, seen = [], {}
    for d in site.devices:
        if (d.node, d.gpu) not in seen:
            seen[(d.node, d.gpu)] = len(gpu_rows)
            gpu_rows.append(
                Gpu(
                    node=nodes[d.node],
                    index=d.gpu,
                    uuid=f"GPU-bench-{d.node}-{d.gpu}",
                    model=d.model,
                    memory_mib=81920,
                    mig_mode=d.profile is not None,
                    sharing=Gpu.Sharing.SHARED if d.shared else Gpu.Sharing.EXCLUSIVE,
                )
            )
    gpus = Gpu.objects.bulk_create(gpu_rows)
    # Packed in listing order on each GPU, as registration places them (services/fleet/nodes.py).
    packed: dict[tuple, int] = {}
    mig_rows = []
    for d in site.devices:
        if d.profile is None:
            continue
        first = packed.get((d.node, d.gpu), 0)
        packed[(d.node, d.gpu)] = first + d.slices
        mig_rows.append(
            MigInstance(
                gpu=gpus[seen[(d.node, d.gpu)]],
                profile=d.profile,
                uuid=f"MIG-bench-{d.node}-{d.gpu}-{d.mig}",
                slices=d.slices,
                placement_start=min(first, 7 - d.slices),
                memory_mib=10240 * d.slices,
            )
        )
    migs = MigInstance.objects.bulk_create(mig_rows)
    mig_of = iter(migs)
    where = {}
    for d in site.devices:
        gpu = gpus[seen[(d.node, d.gpu)]]
        where[d.id] = (gpu.pk, next(mig_of).pk if d.profile else None, d.fraction)

    # API clients take over running bookings: one to extend and three to release each.
    client_users = list(range(clients))
    for c in client_users:
        for b in site.running[c * 4 : c * 4 + 4]:
            b.user, b.project = c, site.user_project[c]
        extendable = site.running[c * 4]
        extendable.duration_s = -extendable.start_in_s + 3600  # ends in an hour: room to extend

    def booking(b, state, **extra):
        return Booking(
            owner=users[b.user],
            project=projects[b.project],
            gpus=0 if b.mig_profile else b.gpus,
            mig_profile=b.mig_profile or "",
            gpu_model=b.gpu_model or "",
            duration_s=b.duration_s,
            qos=b.qos,
            preemptible=b.preemptible,
            command=b.command,
            state=state,
            submitted_at=now - timedelta(seconds=b.submitted_ago_s),
            gpu_fraction=b.gpu_fraction,
            cpus=draw.choice(ASKED_CPUS) if resources else None,
            memory_mib=draw.choice(ASKED_MEMORY_MIB) if resources else None,
            **extra,
        )

    live = [
        (b, booking(b, Booking.State.ACTIVE, started_at=now + timedelta(seconds=b.start_in_s)))
        for b in site.running
    ]
    live += [
        (
            b,
            booking(
                b,
                Booking.State.PLANNED,
                start=now + timedelta(seconds=b.start_in_s),
                end=now + timedelta(seconds=b.start_in_s + b.duration_s),
                planned_start=now + timedelta(seconds=b.start_in_s),
            ),
        )
        for b in site.reservations
    ]
    done = [
        (
            b,
            booking(
                b,
                Booking.State.FINISHED,
                started_at=now + timedelta(seconds=b.start_in_s),
                ended_at=now + timedelta(seconds=b.start_in_s + b.duration_s),
            ),
        )
        for b in site.finished
    ]
    Booking.objects.bulk_create([row for _, row in live + done], batch_size=2000)
    Booking.objects.bulk_create(
        (booking(b, Booking.State.PENDING) for b in site.pending), batch_size=2000
    )
    allocations = []
    for b, row in live + done:
        start = now + timedelta(seconds=b.start_in_s)
        for device in b.devices:
            gpu_id, mig_id, fraction = where[device]
            share = {}
            if b.gpu_fraction is not None:  # a compute share f holds f of the GPU's memory
                fraction = b.gpu_fraction
                share = {"share": fraction, "gpu_memory_mib": int(fraction * 81920)}
            allocations.append(
                Allocation(
                    booking=row,
                    gpu_id=gpu_id,
                    mig_instance_id=mig_id,
                    start=start,
                    end=start + timedelta(seconds=b.duration_s),
                    fraction=fraction,
                    live=row.state != Booking.State.FINISHED,
                    **share,
                )
            )
    Allocation.objects.bulk_create(allocations, batch_size=5000)

    out = []
    for c in client_users:
        raw = f"gpt_bench{c}_{secrets.token_urlsafe(24)}"
        ApiToken.objects.create(
            user=users[c], name="bench", key_hash=hash_token(raw), prefix=raw[:12]
        )
        mine = [row for b, row in live if b.user == c and row.state == Booking.State.ACTIVE]
        out.append((raw, [row.pk for row in mine]))
    return out


# --- API clients (a separate process: their timing must not wait on the pass's GIL) ---


def _client(base: str, token: str, active: list[int], stop, results, seed: int) -> None:
    import http.client

    rng = random.Random(seed)
    host, port = base.split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    headers = {"Authorization": f"Token {token}", "Content-Type": "application/json"}
    extendable, releasable = active[0], list(active[1:])

    def call(op: str, path: str, body: dict | None = None) -> dict | None:
        nonlocal conn
        began = time.perf_counter()
        try:
            conn.request("POST", path, json.dumps(body or {}), headers)
            response = conn.getresponse()
            data = response.read()
            status = response.status
        except OSError:
            conn.close()
            conn = http.client.HTTPConnection(host, int(port), timeout=30)
            status, data = 0, b""
        done = time.time()
        body = data[:300] if status >= 400 else b""
        results.append((op, status, (time.perf_counter() - began) * 1000, body, done))
        try:
            return json.loads(data) if status in (200, 201) else None
        except ValueError:
            return None

    while not stop.is_set():
        time.sleep(rng.uniform(0.25, 0.75))
        op = rng.random()
        if op < 0.45:
            booked = call(
                "submit",
                "/api/v1/bookings/",
                {
                    "gpus": rng.choice([1, 1, 2]),
                    "duration_s": rng.randint(600, 7200),
                    "command": "python bench.py",
                },
            )
            if booked:
                time.sleep(rng.uniform(0.1, 0.4))
                if booked.get("state") == "pending":
                    call("cancel", f"/api/v1/bookings/{booked['id']}/cancel/")
                else:
                    releasable.append(booked["id"])
        elif op < 0.8:
            call("extend", f"/api/v1/bookings/{extendable}/extend/", {"by_s": rng.randint(60, 300)})
        elif releasable:
            call("release", f"/api/v1/bookings/{releasable.pop()}/release/")


def _clients_main(base: str, clients: list, stop, queue) -> None:
    import threading

    results: list = []
    threads = [
        threading.Thread(target=_client, args=(base, token, active, stop, results, i))
        for i, (token, active) in enumerate(clients)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    queue.put(results)


def _start_server(args, port: int) -> subprocess.Popen:
    # A bounded thread pool: each thread holds a database connection.
    env = {
        **os.environ,
        "DATABASE_URL": args.database_url,
        "REDIS_URL": args.redis_url,
        "ASGI_THREADS": str(args.server_threads),
    }
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "daphne",
            "-b",
            "127.0.0.1",
            "-p",
            str(port),
            "portal.asgi:application",
        ],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=open(SERVER_LOG, "w"),  # noqa: SIM115 (the server process owns it)
    )
    import urllib.request

    for _ in range(100):
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v1/", timeout=1)
            return server
        except OSError as exc:
            if getattr(exc, "code", None):
                return server  # any HTTP answer (401) means it is up
            time.sleep(0.2)
    server.kill()
    raise RuntimeError("the API server did not start")


# --- measuring ---


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _pass():
    from django.utils import timezone

    from portal.services.allocation.allocation import allocation_pass

    began, cpu = time.perf_counter(), time.process_time()
    result = allocation_pass(now=timezone.now())
    result.timings["worker_cpu"] = time.process_time() - cpu
    return time.perf_counter() - began, result


def _line(i: int, seconds: float, result) -> str:
    t = result.timings
    return (
        f"pass {i}: {seconds:.3f} s  snapshot {t.get('snapshot', 0):.3f}  plan "
        f"{t.get('plan', 0):.3f}  start {t.get('start', 0):.3f}  store {t.get('store', 0):.3f}"
        f"  other {t.get('housekeeping', 0):.3f}  (worker CPU {t['worker_cpu']:.3f})"
        f"  | pending {result.pending} started"
        f" {result.started} skipped {result.skipped} stored {result.stored} finished"
        f" {result.finished} preempted {result.preempted}"
    )


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pending", type=int, default=10_000)
    parser.add_argument("--gpus", type=int, default=1024)
    parser.add_argument("--passes", type=int, default=8)
    parser.add_argument("--clients", type=int, default=20)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--database-url", default=DEFAULT_DB)
    parser.add_argument("--redis-url", default=DEFAULT_REDIS)
    parser.add_argument("--memory-passes", type=int, default=0)
    parser.add_argument("--no-api", action="store_true")
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument("--api-idle-s", type=float, default=10.0)
    parser.add_argument("--server-threads", type=int, default=8)
    parser.add_argument("--shared-nodes", type=int, default=0)
    parser.add_argument("--fractional", type=int, default=0)
    parser.add_argument(
        "--cpus",
        action="store_true",
        help="nodes with cores and memory, bookings asking random cpus/memory (some None)",
    )
    args = parser.parse_args()
    if args.fractional and not args.shared_nodes:
        parser.error("--fractional needs --shared-nodes: fractions only go to shared GPUs")

    calib = calib_s()  # before anything else runs
    import redis

    redis.Redis.from_url(args.redis_url).flushdb()
    began = time.perf_counter()
    _recreate_database(args.database_url)
    _setup_django(args)
    site = generate(pending=args.pending, gpus=args.gpus, seed=args.seed)
    if args.shared_nodes:
        site = with_shared(
            site, shared_nodes=args.shared_nodes, fractional=args.fractional, seed=args.seed
        )
    clients = _build(site, 0 if args.no_api else args.clients, resources=args.cpus)
    print(
        f"site: {len(site.devices)} devices on {site.nodes} nodes ({args.gpus} GPUs), "
        f"{len(site.running)} running bookings, {len(site.reservations)} reservations, "
        f"{len(site.pending)} pending ({args.fractional} fractional), {site.users} users in "
        f"{site.projects} projects; "
        f"built in {time.perf_counter() - began:.1f} s"
    )
    first, result = _pass()
    print("first " + _line(0, first, result))

    server = stop = proc = queue = None
    if not args.no_api:
        server = _start_server(args, args.port)
        ctx = multiprocessing.get_context("spawn")
        stop, queue = ctx.Event(), ctx.Queue()
        proc = ctx.Process(
            target=_clients_main, args=(f"127.0.0.1:{args.port}", clients, stop, queue)
        )
        proc.start()
        time.sleep(args.api_idle_s)  # the API alone first: its latency without passes
    passes_began = time.time()
    times, plans, cpus = [], [], []
    try:
        for i in range(1, args.passes + 1):
            seconds, result = _pass()
            times.append(seconds)
            plans.append(result.timings.get("plan", 0.0))
            cpus.append(result.timings["worker_cpu"])
            print(_line(i, seconds, result), flush=True)
    finally:
        calls = []
        if proc is not None:
            stop.set()
            calls = queue.get(timeout=60)
            proc.join()
        if server is not None:
            server.terminate()
            server.wait(10)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    summary = {
        "pending": args.pending,
        "gpus": args.gpus,
        "shared_nodes": args.shared_nodes,
        "fractional": args.fractional,
        "cpus": args.cpus,
        "passes": len(times),
        "first_pass_s": round(first, 3),
        "pass_p50_s": round(statistics.median(times), 3),
        "pass_p95_s": round(_pct(times, 0.95), 3),
        "plan_s": round(statistics.median(plans), 3),
        "pass_worker_cpu_p50_s": round(statistics.median(cpus), 3),
        "load_average": round(os.getloadavg()[0], 2),
        "peak_rss_mb": round(peak, 1),
        "calib_s": calib,
    }
    if calls:
        idle = [ms for _, _, ms, _, done in calls if done < passes_began]
        calls = [call for call in calls if call[4] >= passes_began]
        latencies = [ms for _, _, ms, _, _ in calls]
        codes: dict[str, int] = {}
        examples: dict[str, bytes] = {}
        for op, status, _, body, _ in calls:
            codes[f"{op}:{status}"] = codes.get(f"{op}:{status}", 0) + 1
            if body:
                examples.setdefault(f"{op}:{status}", body)
        print(f"api during passes: {len(calls)} calls, codes {dict(sorted(codes.items()))}")
        for key, body in sorted(examples.items()):
            print(f"api {key} e.g. {body.decode(errors='replace')[:200]}")
        summary.update(
            api_calls=len(calls),
            api_p50_ms=round(statistics.median(latencies), 1),
            api_p95_ms=round(_pct(latencies, 0.95), 1),
            api_503=sum(1 for _, status, _, _, _ in calls if status == 503),
            api_5xx=sum(1 for _, status, _, _, _ in calls if status >= 500 or status == 0),
            api_idle_p95_ms=round(_pct(idle, 0.95), 1) if idle else None,
        )
    if args.memory_passes:
        early = None
        for i in range(args.memory_passes):
            _pass()
            if i == args.memory_passes // 10:
                early = _rss_mb()
        summary.update(
            rss_mb_after_10pct=round(early, 1),
            rss_mb_after_all=round(_rss_mb(), 1),
            memory_passes=args.memory_passes,
        )
        print(
            f"memory: {early:.1f} MB after {args.memory_passes // 10 + 1} passes, "
            f"{_rss_mb():.1f} MB after {args.memory_passes}"
        )
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
