"""HTTP load: the real server under stepped, bounded request rates, on PostgreSQL and Redis.

Recreates its own database (gp_bench_http) and flushes its own Redis db (10), seeds the demo scaled
up (--gpus GPUs on 8-GPU nodes, --bookings bookings over --users users, each user in a project of
their own), starts `manage.py serve` (uvicorn, WEB_WORKERS processes) and sends requests at fixed
rates, each step for --seconds:

    GET   bookings/ and gpus/ (50 a page, token auth, alternating)   50, 100, 200 /s
    GET   the overview page and its fragments (session cookie)        10 /s
    GET   overview opens (the page), then node expands (a node's devices)  50, 10 /s
    POST  bookings/ (a 1-GPU reservation in the coming weeks)         25, 50 /s
    POST  bookings/estimate/ (a queued 1-GPU request, --pending queued)  5 /s
    GET   200 /s with --ws-clients websockets open, readings at 1 Hz
    overload: GET 400 /s and POST 100 /s together (twice the targets)

A request's latency counts from when it was due (open loop), so a slow server cannot hide queueing.
Prints a table (served/s, p50/p95/p99 of the 2xx answers, answers by status, server CPU) and, last,
one JSON line, with calib_s (benchmarks/calib.py, timed before the server starts). Targets on a
2-core machine (calib_s 0.39; they scale with it) with this generator on it: GET 200/s at p95 < 100 ms,
POST 50/s at p95 < 200 ms, no 5xx other than 503 at twice those rates, websocket p95 delay < 1 s,
overview 50 opens/s at p95 < 300 ms, estimate p95 < 150 ms. --overview-only runs just the overview
steps; --estimate-only just the estimate, after one step of estimates that warms every web
process's copy of the queue.

    flock /tmp/gp-bench.lock python benchmarks/bench_http.py
    python benchmarks/bench_http.py --gpus 64 --bookings 500 --seconds 3 --ws-clients 20  # smoke
    python benchmarks/bench_http.py --overview-only --gpus 4096 --bookings 10000 --seconds 10
    python benchmarks/bench_http.py --estimate-only --bookings 20000 --pending 10000
"""

import argparse
import asyncio
import json
import multiprocessing
import os
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from calib import calib_s  # noqa: E402

DB_NAME = "gp_bench_http"
PG = "postgres://postgres@127.0.0.1:5432"
REDIS_URL = "redis://127.0.0.1:6379/10"
TARGETS = {"get_rps": 200, "get_p95_ms": 100, "post_rps": 50, "post_p95_ms": 200, "ws_p95_ms": 1000}
TARGETS["estimate_p95_ms"] = 150
ESTIMATE_LOAD = "POST bookings/estimate/ 5/s"
OVERVIEW_TARGETS = {"overview_rps": 50, "overview_p95_ms": 300, "calib_s": 0.39}
PASSWORD = "bench-http-pw-2026"


def _environment(var_dir: str) -> dict:
    return {
        **os.environ,
        "DATABASE_URL": f"{PG}/{DB_NAME}",
        "REDIS_URL": REDIS_URL,
        "DJANGO_SETTINGS_MODULE": "portal.settings",
        "SECRET_KEY": "bench-http-" + "k" * 40,
        "DEBUG": "0",
        "ALLOWED_HOSTS": "127.0.0.1,localhost",
        "PORTAL_VAR_DIR": var_dir,
        "LOG_LEVEL": "WARNING",
    }


def _recreate_database() -> None:
    import psycopg

    with psycopg.connect(f"{PG}/postgres", autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{DB_NAME}" WITH (FORCE)')
        admin.execute(f'CREATE DATABASE "{DB_NAME}"')


def _drop_database() -> None:
    import psycopg

    with psycopg.connect(f"{PG}/postgres", autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{DB_NAME}" WITH (FORCE)')


def _seed(args) -> dict:
    """Migrate and build the scaled demo; returns tokens, a session cookie and the project slugs."""
    import django

    django.setup()
    from django.contrib.auth import get_user_model
    from django.core.management import call_command

    from portal.models import (
        Allocation,
        ApiToken,
        Booking,
        Gpu,
        Membership,
        Node,
        NodeHeartbeat,
        Project,
        Quota,
    )
    from portal.models.tokens import hash_token, new_token

    call_command("migrate", verbosity=0)
    call_command("collectstatic", interactive=False, verbosity=0)
    now = datetime.now(UTC)
    nodes = Node.objects.bulk_create(
        Node(hostname=f"bench-{n:03d}", state=Node.State.UP) for n in range(args.gpus // 8)
    )
    NodeHeartbeat.objects.bulk_create(NodeHeartbeat(node=node, last_seen=now) for node in nodes)
    gpus = Gpu.objects.bulk_create(
        Gpu(node=node, index=i, uuid=f"GPU-bench-{node.pk:04d}-{i}", model="A100-80GB",
            memory_mib=81920)
        for node in nodes
        for i in range(8)
    )  # fmt: skip
    users, projects, tokens = [], [], []
    for u in range(args.users):
        user = get_user_model().objects.create_user(f"bench{u:02d}", password=PASSWORD)
        project = Project.objects.create(slug=f"bench-{u:02d}", name=f"Bench {u}")
        Membership.objects.create(user=user, project=project, role=Membership.Role.MEMBER)
        Quota.objects.create(project=project, user=None, max_gpus=args.gpus)
        raw = new_token("gp")
        ApiToken.objects.create(user=user, key_hash=hash_token(raw), prefix=raw[:10])
        users.append(user), projects.append(project), tokens.append(raw)
    _seed_bookings(args, now, users, projects, gpus, Booking, Allocation)
    return {
        "tokens": tokens,
        "slugs": [p.slug for p in projects],
        "cookie": _cookie(users[0]),
        "nodes": len(nodes),
    }


def _seed_bookings(args, now, users, projects, gpus, Booking, Allocation) -> None:
    """Mostly finished bookings (one GPU each), a few hundred active and some pending."""
    rng = random.Random(7)
    bookings, devices = [], []
    active = min(len(gpus) // 2, args.bookings // 20)
    for b in range(args.bookings):
        owner = b % len(users)
        if b < active:
            state, start = Booking.State.ACTIVE, now - timedelta(hours=1)
            gpu = gpus[b]
        elif b < active + _pending(args):
            state, start, gpu = Booking.State.PENDING, None, None
        else:
            state = Booking.State.FINISHED
            start = now - timedelta(days=60) + timedelta(hours=b % 1400)
            gpu = gpus[rng.randrange(len(gpus))]
        booking = Booking(
            owner=users[owner],
            project=projects[owner],
            gpus=1,
            duration_s=3600,
            state=state,
            submitted_at=(start or now) - timedelta(minutes=5),
            started_at=start,
            ended_at=start + timedelta(hours=1) if state == Booking.State.FINISHED else None,
            command="python train.py --epochs 10",
        )
        bookings.append(booking)
        devices.append((gpu, start, state == Booking.State.ACTIVE))
    Booking.objects.bulk_create(bookings, batch_size=2000)
    Allocation.objects.bulk_create(
        (
            Allocation(booking=booking, gpu=gpu, start=start, end=start + timedelta(hours=1)
                       if not live else now + timedelta(days=1), fraction=1.0, live=live)
            for booking, (gpu, start, live) in zip(bookings, devices, strict=True)
            if gpu is not None
        ),
        batch_size=2000,
    )  # fmt: skip


def _pending(args) -> int:
    """Pending bookings seeded: --pending, or a fiftieth of --bookings."""
    return args.bookings // 50 if args.pending is None else args.pending


def _cookie(user) -> str:
    from django.conf import settings
    from django.contrib.auth import BACKEND_SESSION_KEY, HASH_SESSION_KEY, SESSION_KEY
    from django.contrib.sessions.backends.db import SessionStore

    session = SessionStore()
    session[SESSION_KEY] = str(user.pk)
    session[BACKEND_SESSION_KEY] = settings.AUTHENTICATION_BACKENDS[0]
    session[HASH_SESSION_KEY] = user.get_session_auth_hash()
    session.create()
    return session.session_key


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start_server(env: dict, port: int, workers: int | None, log) -> subprocess.Popen:
    command = [sys.executable, "manage.py", "serve", "--port", str(port)]
    if workers:
        command += ["--workers", str(workers)]
    server = subprocess.Popen(command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"the server exited with {server.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return server
        except OSError:
            time.sleep(0.2)
    server.kill()
    raise RuntimeError("the server did not listen within 60 s")


def _cpu_seconds(root_pid: int) -> float:
    """User + system CPU of a process and all its descendants, from /proc."""
    children: dict[int, list[int]] = {}
    ticks: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(entry))
        ticks[int(entry)] = int(fields[11]) + int(fields[12])
    total, todo = 0, [root_pid]
    while todo:
        pid = todo.pop()
        total += ticks.get(pid, 0)
        todo += children.get(pid, [])
    return total / os.sysconf("SC_CLK_TCK")


class Load:
    """The request kinds, each an async function returning the HTTP status (0: no answer)."""

    def __init__(self, session, base: str, seeded: dict):
        self.session, self.base, self.seeded = session, base, seeded
        self.count = 0
        self.rng = random.Random(11)

    def _token(self) -> dict:
        self.count += 1
        tokens = self.seeded["tokens"]
        return {"Authorization": f"Token {tokens[self.count % len(tokens)]}"}

    async def _fetch(self, method: str, path: str, **kwargs) -> int:
        try:
            async with self.session.request(method, self.base + path, **kwargs) as response:
                await response.read()
                return response.status
        except Exception:
            return 0

    async def get(self) -> int:
        path = "/api/v1/bookings/" if self.count % 2 else "/api/v1/gpus/"
        return await self._fetch("GET", path, headers=self._token())

    async def page(self) -> int:
        path = ["/", "/?fragment=devices", "/?fragment=mine", "/?fragment=totals"][self.count % 4]
        self.count += 1
        cookies = {"sessionid": self.seeded["cookie"]}
        return await self._fetch(
            "GET", path, headers={"Cookie": f"sessionid={cookies['sessionid']}"}
        )

    async def estimate(self) -> int:
        headers = self._token()
        slug = self.seeded["slugs"][self.count % len(self.seeded["slugs"])]
        body = {"project": slug, "gpus": 1, "duration_s": 600 * self.rng.randrange(1, 36)}
        return await self._fetch("POST", "/api/v1/bookings/estimate/", json=body, headers=headers)

    async def overview_open(self) -> int:
        """Open the overview: the page (it fetches nothing more until a node is expanded)."""
        headers = {"Cookie": f"sessionid={self.seeded['cookie']}"}
        return await self._fetch("GET", "/", headers=headers)

    async def node_expand(self) -> int:
        """Expand one node of the overview: its devices."""
        self.count += 1
        node = f"bench-{self.count % max(1, self.seeded['nodes']):03d}"
        headers = {"Cookie": f"sessionid={self.seeded['cookie']}"}
        return await self._fetch("GET", f"/?fragment=node&node={node}", headers=headers)

    async def post(self) -> int:
        headers = self._token()
        slug = self.seeded["slugs"][self.count % len(self.seeded["slugs"])]
        start = datetime.now(UTC) + timedelta(days=2, hours=self.rng.randrange(24 * 60))
        end = start + timedelta(hours=1)
        body = {"project": slug, "gpus": 1, "start": start.isoformat(), "end": end.isoformat()}
        return await self._fetch("POST", "/api/v1/bookings/", json=body, headers=headers)


async def _drive(kind, rate: float, seconds: float, results: list) -> None:
    """Send `kind` at `rate`/s for `seconds`; append (latency from when due, status)."""

    async def one(due: float):
        late = time.monotonic() - due  # this generator's own lag, shown apart
        status = await kind()
        results.append((time.monotonic() - due, status, late))

    start = time.monotonic()
    tasks = []
    for i in range(int(rate * seconds)):
        due = start + i / rate
        await asyncio.sleep(max(0.0, due - time.monotonic()))
        tasks.append(asyncio.create_task(one(due)))
    await asyncio.gather(*tasks)


def _summary(name: str, rate: float, seconds: float, results: list, cpu_s: float) -> dict:
    ok = sorted(latency for latency, status, _ in results if 200 <= status < 300)
    late = sorted(lag for *_, lag in results)

    def pct(p: float):
        return round(1000 * ok[min(len(ok) - 1, int(p * len(ok)))], 1) if ok else None

    statuses = Counter(status for _, status, _ in results)
    return {
        "load": name,
        "rate": rate,
        "served_rps": round(len(ok) / seconds, 1),
        "p50_ms": round(1000 * statistics.median(ok), 1) if ok else None,
        "p95_ms": pct(0.95),
        "p99_ms": pct(0.99),
        "errors": {str(k): v for k, v in sorted(statuses.items()) if not 200 <= k < 300},
        "server_cpu_pct": round(100 * cpu_s / seconds),
        "generator_lag_p95_ms": round(1000 * late[int(0.95 * (len(late) - 1))], 1)
        if late
        else None,
    }


async def _step(server_pid: int, name: str, kinds: list, seconds: float) -> list[dict]:
    """Run several (label, kind, rate) loads at once for `seconds`; one summary per load."""
    cpu_before = _cpu_seconds(server_pid)
    results = [[] for _ in kinds]
    await asyncio.gather(
        *(
            _drive(kind, rate, seconds, out)
            for (_, kind, rate), out in zip(kinds, results, strict=True)
        )
    )
    cpu = _cpu_seconds(server_pid) - cpu_before
    return [
        _summary(f"{name}: {label}" if len(kinds) > 1 else name, rate, seconds, out, cpu)
        for (label, _, rate), out in zip(kinds, results, strict=True)
    ]


async def _ws_clients(port: int, cookie: str, count: int, delays: list, stop: asyncio.Event):
    import websockets

    url = f"ws://127.0.0.1:{port}/ws/live/"
    headers = {"Cookie": f"sessionid={cookie}", "Origin": f"http://127.0.0.1:{port}"}
    opened = asyncio.Semaphore(50)
    ready = []

    async def client():
        async with opened:
            ws = await websockets.connect(url, additional_headers=headers, max_size=None)
        event = asyncio.Event()
        ready.append(event)
        event.set()
        async with ws:
            while not stop.is_set():
                try:
                    raw = await asyncio.wait_for(ws.recv(), timeout=0.5)
                except TimeoutError:
                    continue
                message = json.loads(raw)
                if message.get("type") == "telemetry.readings" and "bench_sent" in message:
                    delays.append(time.time() - message["bench_sent"])

    tasks = [asyncio.create_task(client()) for _ in range(count)]
    while len(ready) < count:
        if any(t.done() and t.exception() for t in tasks):
            raise RuntimeError(next(t.exception() for t in tasks if t.done() and t.exception()))
        await asyncio.sleep(0.1)
    return tasks


def _ws_process(port: int, cookie: str, count: int, seconds: float, ready, out) -> None:
    """Child process: open `count` sockets, publish readings at 1 Hz, send back the delays."""
    import django

    django.setup()
    out.put(asyncio.run(_ws_phase(port, cookie, count, seconds, ready)))


async def _ws_phase(port: int, cookie: str, count: int, seconds: float, ready) -> dict:
    delays: list[float] = []
    stop = asyncio.Event()
    clients = await _ws_clients(port, cookie, count, delays, stop)
    ready.set()
    sent = await _publish(seconds)
    await asyncio.sleep(1.5)  # the last second's messages
    stop.set()
    await asyncio.gather(*clients, return_exceptions=True)
    return {"sent": sent, "delays": delays}


async def _publish(seconds: float, gpus_per_batch: int = 8) -> int:
    """One node's readings a second to the telemetry group, as the agent ingest sends them."""
    from channels.layers import get_channel_layer

    layer = get_channel_layer()
    start = time.monotonic()
    for second in range(int(seconds)):
        await asyncio.sleep(max(0.0, start + second - time.monotonic()))
        now = datetime.now(UTC).isoformat()
        readings = [
            {"uuid": f"GPU-bench-{second % 100:04d}-{i}", "utilization_gpu": 50.0,
             "memory_used_mib": 1024, "memory_total_mib": 81920, "temperature_c": 50.0,
             "power_w": 300.0, "processes": [], "time": now}
            for i in range(gpus_per_batch)
        ]  # fmt: skip
        await layer.group_send(
            "telemetry",
            {"type": "telemetry.readings", "node": "bench", "time": now, "readings": readings,
             "bench_sent": time.time()},
        )  # fmt: skip
    return int(seconds)


async def _run(args, seeded: dict, port: int, server_pid: int) -> tuple[list[dict], dict]:
    import aiohttp

    connector = aiohttp.TCPConnector(limit=1000)
    timeout = aiohttp.ClientTimeout(total=args.request_timeout)
    rows: list[dict] = []
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        load = Load(session, f"http://127.0.0.1:{port}", seeded)
        s = args.seconds
        await _step(server_pid, "warm-up", [("", load.get, 20)], 3)
        if args.estimate_only:
            # Every web process reads and walks its own copy of the queue on its first
            # estimate: warm them all before the step that counts.
            rows += await _step(server_pid, "estimate warm-up 5/s", [("", load.estimate, 5)], s)
            rows += await _step(server_pid, ESTIMATE_LOAD, [("", load.estimate, 5)], s)
            return rows, {}
        for rate in () if args.overview_only else (50, 100, 200):
            rows += await _step(
                server_pid, f"GET bookings/+gpus/ {rate}/s", [("", load.get, rate)], s
            )
        rows += await _step(server_pid, "GET overview + fragments 10/s", [("", load.page, 10)], s)
        rows += await _overview_step(server_pid, load, s)
        if args.overview_only:
            return rows, {}
        for rate in (25, 50):
            rows += await _step(server_pid, f"POST bookings/ {rate}/s", [("", load.post, rate)], s)
        rows += await _step(server_pid, ESTIMATE_LOAD, [("", load.estimate, 5)], s)
        # The websocket clients and the publisher run in a process of their own, so that
        # handling 500 sockets does not delay this process's requests (nor their timing).
        context = multiprocessing.get_context("spawn")
        ready, out = context.Event(), context.Queue()
        ws_args = (port, seeded["cookie"], args.ws_clients, s, ready, out)
        ws_process = context.Process(target=_ws_process, args=ws_args)
        ws_process.start()
        loop = asyncio.get_running_loop()
        if not await loop.run_in_executor(None, ready.wait, 120):
            raise RuntimeError("the websocket clients did not connect within 120 s")
        rows += await _step(
            server_pid, f"GET 200/s, {args.ws_clients} ws at 1 Hz", [("", load.get, 200)], s
        )
        ws_result = await loop.run_in_executor(None, out.get, True, 60)
        ws_process.join(10)
        sent, delays = ws_result["sent"], ws_result["delays"]
        rows += await _step(
            server_pid,
            "overload 2x",
            [("GET 400/s", load.get, 400), ("POST 100/s", load.post, 100)],
            s,
        )
    ws = sorted(delays)
    ws_row = {
        "clients": args.ws_clients,
        "expected": sent * args.ws_clients,
        "received": len(ws),
        "p95_ms": round(1000 * ws[int(0.95 * (len(ws) - 1))], 1) if ws else None,
    }
    return rows, ws_row


OVERVIEW_STEP = "GET overview opens 50/s"


async def _overview_step(server_pid: int, load: Load, seconds: float) -> list[dict]:
    """50 opens/s of the overview, then 10 node expands/s (the devices of one node)."""
    rows = await _step(server_pid, OVERVIEW_STEP, [("", load.overview_open, 50)], seconds)
    expand = [("", load.node_expand, 10)]
    return rows + await _step(server_pid, "GET overview node expands 10/s", expand, seconds)


def _overview_result(rows: list[dict], calib: float) -> dict:
    """overview_rps and overview_p95_ms, and whether they meet the target scaled by calib_s."""
    step = {r["load"]: r for r in rows}[OVERVIEW_STEP]
    scale = calib / OVERVIEW_TARGETS["calib_s"]
    result = {"overview_rps": step["served_rps"], "overview_p95_ms": step["p95_ms"]}
    result["overview_ok"] = bool(
        step["served_rps"] >= 0.95 * OVERVIEW_TARGETS["overview_rps"]
        and (step["p95_ms"] or 1e9) < OVERVIEW_TARGETS["overview_p95_ms"] * scale
    )
    return result


def _table(rows: list[dict]) -> str:
    lines = [
        "| load | served/s | p50 / p95 / p99 ms | errors | server CPU | generator lag p95 ms |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        errors = ", ".join(f"{n} x {k}" for k, n in r["errors"].items()) or "0"
        lines.append(
            f"| {r['load']} | {r['served_rps']} | {r['p50_ms']} / {r['p95_ms']} / {r['p99_ms']} "
            f"| {errors} | {r['server_cpu_pct']}% | {r['generator_lag_p95_ms']} |"
        )
    return "\n".join(lines)


def _result(args, rows: list[dict], ws: dict, workers: int) -> dict:
    by_load = {r["load"]: r for r in rows}
    get, post = by_load["GET bookings/+gpus/ 200/s"], by_load["POST bookings/ 50/s"]
    overload = [r for r in rows if r["load"].startswith("overload")]
    overload_5xx = sum(
        n for r in overload for k, n in r["errors"].items() if k.startswith("5") and k != "503"
    )
    result = {
        "bench": "http",
        "gpus": args.gpus,
        "bookings": args.bookings,
        "seconds_per_step": args.seconds,
        "web_workers": workers,
        "get_rps": get["served_rps"],
        "get_p95_ms": get["p95_ms"],
        "post_rps": post["served_rps"],
        "post_p95_ms": post["p95_ms"],
        "overload_5xx": overload_5xx,
        "overload_503": sum(r["errors"].get("503", 0) for r in overload),
        "overload_no_answer": sum(r["errors"].get("0", 0) for r in overload),
        "ws_clients": ws["clients"],
        "ws_received": ws["received"],
        "ws_expected": ws["expected"],
        "ws_p95_delay_ms": ws["p95_ms"],
        "ws_get_p95_ms": by_load[f"GET 200/s, {args.ws_clients} ws at 1 Hz"]["p95_ms"],
        # Other work on the machine skews every figure: the load average when the run ended.
        "loadavg_1m_at_end": round(os.getloadavg()[0], 2),
    }
    result.update(_estimate_result(by_load))
    result["ok"] = bool(
        result["get_rps"] >= 0.95 * TARGETS["get_rps"]
        and (result["get_p95_ms"] or 1e9) < TARGETS["get_p95_ms"]
        and result["post_rps"] >= 0.95 * TARGETS["post_rps"]
        and (result["post_p95_ms"] or 1e9) < TARGETS["post_p95_ms"]
        and overload_5xx == 0
        and (result["ws_p95_delay_ms"] or 1e9) < TARGETS["ws_p95_ms"]
        and (result["estimate_p95_ms"] or 1e9) < TARGETS["estimate_p95_ms"]
    )
    return result


def _estimate_result(by_load: dict) -> dict:
    """The estimate's figures for the JSON line."""
    row = by_load[ESTIMATE_LOAD]
    return {"estimate_rps": row["served_rps"], "estimate_p95_ms": row["p95_ms"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, default=1024)
    parser.add_argument("--bookings", type=int, default=10000)
    parser.add_argument("--users", type=int, default=10)
    parser.add_argument("--pending", type=int, help="pending bookings (default: --bookings / 50)")
    parser.add_argument("--seconds", type=float, default=15, help="per step")
    parser.add_argument("--ws-clients", type=int, default=500)
    parser.add_argument("--workers", type=int, help="web workers (default: WEB_WORKERS)")
    parser.add_argument("--request-timeout", type=float, default=10.0)
    parser.add_argument("--keep", action="store_true", help="keep the database afterwards")
    parser.add_argument("--overview-only", action="store_true", help="only the overview steps")
    parser.add_argument(
        "--estimate-only", action="store_true", help="only the estimate (after a warm-up step)"
    )
    args = parser.parse_args()

    var_dir = tempfile.mkdtemp(prefix="bench-http-")
    env = _environment(var_dir)
    os.environ.update({k: env[k] for k in ("DATABASE_URL", "REDIS_URL", "DJANGO_SETTINGS_MODULE",
                                          "SECRET_KEY", "DEBUG", "PORTAL_VAR_DIR")})  # fmt: skip
    calib = calib_s()  # before the server and the seed load the machine
    import redis

    redis.Redis.from_url(REDIS_URL).flushdb()
    _recreate_database()
    seeded = _seed(args)
    from django.conf import settings
    from django.db import connections

    connections.close_all()
    workers = args.workers or settings.WEB_WORKERS
    port = _free_port()
    with open(Path(var_dir) / "server.log", "wb") as log:
        server = _start_server(env, port, args.workers, log)
        try:
            rows, ws = asyncio.run(_run(args, seeded, port, server.pid))
        finally:
            server.terminate()
            try:
                server.wait(timeout=15)
            except subprocess.TimeoutExpired:
                server.kill()
            connections.close_all()
            if not args.keep:
                _drop_database()
    print(_table(rows))
    print(f"websockets: {ws}")
    print(f"server log: {Path(var_dir) / 'server.log'}")
    if args.estimate_only:
        result = {"bench": "http", "gpus": args.gpus, "bookings": args.bookings}
        result |= {"pending": args.pending, "seconds_per_step": args.seconds}
        result |= {"web_workers": workers, "loadavg_1m_at_end": round(os.getloadavg()[0], 2)}
        by_load = {r["load"]: r for r in rows}
        print(json.dumps({**result, "calib_s": calib, **_estimate_result(by_load)}))
        return
    overview = _overview_result(rows, calib)
    if args.overview_only:
        result = {"bench": "http", "gpus": args.gpus, "bookings": args.bookings}
        result |= {"seconds_per_step": args.seconds, "web_workers": workers}
        print(json.dumps({**result, "calib_s": calib, **overview}))
    else:
        print(json.dumps({**_result(args, rows, ws, workers), "calib_s": calib, **overview}))


if __name__ == "__main__":
    main()
