"""Live-feed latency: from a reading reaching the portal to its arrival in a browser's websocket.

Runs a real ASGI server (daphne subprocess) on the Redis channel layer, opens `--clients`
authenticated websocket clients on /ws/live/, and publishes readings of `--gpus` GPUs every
second exactly as the agent ingest does (group_send on "telemetry", one message per node batch,
nodes spread over the second). Prints one JSON line with p50/p95/max delay; target p95 < 1 s.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/gpuportal_bench \\
    REDIS_URL=redis://127.0.0.1:6379/14 python benchmarks/bench_live.py --seconds 30
"""

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from calib import calib_s  # noqa: E402

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings_test")
os.environ.setdefault("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/gpuportal_bench")
os.environ.setdefault("REDIS_URL", "redis://127.0.0.1:6379/14")
TARGET_P95_S = 1.0
# Redis may be shared: count only this run's batches.
RUN = f"bench-{os.getpid()}"


def _ensure_database() -> None:
    import dj_database_url
    import psycopg

    db = dj_database_url.parse(os.environ["DATABASE_URL"])
    with psycopg.connect(
        host=db["HOST"],
        port=db["PORT"] or 5432,
        user=db["USER"],
        dbname="postgres",
        autocommit=True,
    ) as conn:
        if not conn.execute(
            "SELECT 1 FROM pg_database WHERE datname = %s", [db["NAME"]]
        ).fetchone():
            conn.execute(f'CREATE DATABASE "{db["NAME"]}"')


def _session_cookie() -> str:
    """Migrate, make a user and a logged-in session; the cookie a browser would send."""
    import django

    django.setup()
    from django.conf import settings
    from django.contrib.auth import (
        BACKEND_SESSION_KEY,
        HASH_SESSION_KEY,
        SESSION_KEY,
        get_user_model,
    )
    from django.contrib.sessions.backends.db import SessionStore
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    user, _ = get_user_model().objects.get_or_create(username="bench-live")
    session = SessionStore()
    session[SESSION_KEY] = str(user.pk)
    session[BACKEND_SESSION_KEY] = settings.AUTHENTICATION_BACKENDS[0]
    session[HASH_SESSION_KEY] = user.get_session_auth_hash()
    session.create()
    return session.session_key


def _batch(node: int, gpus: int) -> dict:
    now = datetime.now(UTC).isoformat()
    readings = [
        {
            "uuid": f"GPU-bench-{node:03d}-{index}",
            "utilization_gpu": 50.0,
            "utilization_memory": 20.0,
            "memory_used_mib": 1024,
            "memory_total_mib": 81920,
            "temperature_c": 50.0,
            "power_w": 300.0,
            "processes": [],
            "time": now,
        }
        for index in range(gpus)
    ]
    return {
        "type": "telemetry.readings",
        "node": f"{RUN}-{node:03d}",
        "time": now,
        "readings": readings,
    }


async def _client(url: str, cookie: str, port: int, delays: list, ready: asyncio.Event, stop):
    import websockets

    headers = {"Cookie": f"sessionid={cookie}", "Origin": f"http://127.0.0.1:{port}"}
    async with websockets.connect(url, additional_headers=headers, max_size=None) as ws:
        ready.set()
        while not stop.is_set():
            try:
                raw = await asyncio.wait_for(ws.recv(), timeout=0.5)
            except TimeoutError:
                continue
            message = json.loads(raw)
            if message.get("type") == "telemetry.readings" and message["node"].startswith(RUN):
                sent = datetime.fromisoformat(message["time"]).timestamp()
                delays.append(time.time() - sent)


async def _publish(gpus: int, per_node: int, seconds: float) -> int:
    from channels.layers import get_channel_layer

    layer = get_channel_layer()
    nodes = [(n, min(per_node, gpus - n * per_node)) for n in range(-(-gpus // per_node))]
    sent = 0
    start = time.monotonic()
    for second in range(int(seconds)):
        for position, (node, count) in enumerate(nodes):
            # Agents are not synchronised: spread the nodes' batches over the second.
            due = start + second + position / len(nodes)
            await asyncio.sleep(max(0.0, due - time.monotonic()))
            await layer.group_send("telemetry", _batch(node, count))
            sent += 1
    return sent


async def _run(args, cookie: str, port: int) -> dict:
    url = f"ws://127.0.0.1:{port}/ws/live/"
    delays: list[float] = []
    stop = asyncio.Event()
    readies = [asyncio.Event() for _ in range(args.clients)]
    clients = [
        asyncio.create_task(_client(url, cookie, port, delays, ready, stop)) for ready in readies
    ]
    await asyncio.wait_for(asyncio.gather(*(r.wait() for r in readies)), timeout=20)
    await asyncio.sleep(0.5)
    sent = await _publish(args.gpus, args.per_node, args.seconds)
    await asyncio.sleep(1.5)  # let the last messages arrive
    stop.set()
    await asyncio.gather(*clients)
    ordered = sorted(delays)
    return {
        "bench": "live",
        "server": "daphne",
        "channel_layer": "redis",
        "gpus": args.gpus,
        "nodes": len(range(0, args.gpus, args.per_node)),
        "clients": args.clients,
        "seconds": args.seconds,
        "batches_sent": sent,
        "batches_received": len(delays),
        "expected_received": sent * args.clients,
        "p50_ms": round(1000 * statistics.median(ordered), 1) if ordered else None,
        "p95_ms": round(1000 * ordered[int(0.95 * (len(ordered) - 1))], 1) if ordered else None,
        "max_ms": round(1000 * ordered[-1], 1) if ordered else None,
        "target_p95_ms": TARGET_P95_S * 1000,
        "ok": bool(ordered) and ordered[int(0.95 * (len(ordered) - 1))] < TARGET_P95_S,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, default=100)
    parser.add_argument("--per-node", type=int, default=8, help="GPUs per node batch")
    parser.add_argument("--clients", type=int, default=10, help="open browser sockets")
    parser.add_argument("--seconds", type=int, default=30)
    args = parser.parse_args()
    calib = calib_s()
    _ensure_database()
    cookie = _session_cookie()
    from portal.web.asgi_process import daphne_start, daphne_stop, free_port

    port = free_port()
    server = daphne_start(port=port, env=os.environ | {"DEBUG": "1"})
    try:
        result = asyncio.run(_run(args, cookie, port))
    finally:
        daphne_stop(server)
    print(json.dumps({**result, "calib_s": calib}))


if __name__ == "__main__":
    main()
