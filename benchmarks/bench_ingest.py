"""Telemetry ingest throughput into PostgreSQL: service layer and the real HTTP endpoint path.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/gpuportal_bench \
    REDIS_URL=redis://127.0.0.1:6379/14 python benchmarks/bench_ingest.py [--seconds 10]

Uses its own database (created if missing, migrated; any name works, default
gpuportal_bench) and, with REDIS_URL, Redis for the latest-readings cache and the channel
layer, as in production. Simulated agents of 8, 20 (4 GPUs in MIG mode: 16 instances with null
utilization), 32 and 64 devices post batches of one reading per device:

- service: `samples_ingest()` on parsed batches, in this process;
- http: POST /api/v1/agent/readings/ through Django's full request path (test Client: URL
  routing, middleware, node-token auth, heartbeat, protocol parsing, COPY, after-commit cache
  write and channel-layer broadcast), from one process per CPU, each running the agents.

Prints one JSON line with readings/s for both. Target: >= 5,000 readings/s sustained.
"""

import argparse
import json
import multiprocessing
import os
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from calib import calib_s  # noqa: E402

os.environ.setdefault("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/gpuportal_bench")
os.environ.setdefault("DEBUG", "1")  # a development SECRET_KEY; query logging is turned off below
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")

SPECS = {
    "bench-8": "8xH100-80GB",
    "bench-20": "4xA100-80GB:mig=3g.40gb+2g.20gb+2x1g.10gb",
    "bench-32": "32xH100-80GB",
    "bench-64": "64xH100-80GB",
}
BATCHES_PER_AGENT = 50


def _ensure_database(url: str) -> str:
    import dj_database_url
    import psycopg

    config = dj_database_url.parse(url)
    name = config["NAME"]
    admin = psycopg.connect(
        host=config["HOST"] or None,
        port=config["PORT"] or None,
        user=config["USER"] or None,
        password=config["PASSWORD"] or None,
        dbname="postgres",
        autocommit=True,
    )
    with admin:
        if not admin.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone():
            admin.execute(f'CREATE DATABASE "{name}"')
    return name


def _setup() -> dict[str, dict]:
    """Migrate, create the bench nodes with tokens, and pre-build their request bodies."""
    import django
    from django.conf import settings
    from django.core.management import call_command

    django.setup()
    settings.DEBUG = False  # no per-query logging
    settings.ALLOWED_HOSTS = [*settings.ALLOWED_HOSTS, "testserver"]
    call_command("migrate", verbosity=0)

    from agents import protocol
    from agents.simulate import SimulatedBackend
    from portal.models import Sample
    from portal.services.fleet.nodes import node_inventory_from_spec, node_token_issue

    Sample.objects.filter(node__hostname__in=SPECS).delete()
    agents = {}
    start = datetime.now(UTC)
    for hostname, spec in SPECS.items():
        node = node_inventory_from_spec(hostname=hostname, spec=spec)
        backend = SimulatedBackend(spec, hostname=hostname, seed=1)
        bodies = [
            protocol.dumps(
                protocol.ReadingsRequest(hostname, start + timedelta(seconds=i), backend.sample())
            )
            for i in range(BATCHES_PER_AGENT)
        ]
        agents[hostname] = {
            "node_id": node.pk,
            "token": node_token_issue(hostname=hostname),
            "bodies": bodies,
        }
    return agents


def _service_run(agents: dict, seconds: float) -> dict:
    from agents import protocol
    from portal.models import Node
    from portal.services.fleet.telemetry import samples_ingest

    parsed = [
        (Node.objects.get(pk=a["node_id"]), protocol.from_json(protocol.ReadingsRequest, body))
        for a in agents.values()
        for body in a["bodies"]
    ]
    readings = batches = 0
    began = time.perf_counter()
    while time.perf_counter() - began < seconds:
        node, request = parsed[batches % len(parsed)]
        readings += samples_ingest(node=node, request=request)
        batches += 1
    elapsed = time.perf_counter() - began
    return {"readings": readings, "batches": batches, "seconds": elapsed}


def _http_worker(args) -> dict:
    agents, seconds = args
    from django.db import connections
    from django.test import Client

    from agents import protocol

    connections.close_all()  # never share the parent's connection after fork
    clients = [
        (Client(HTTP_AUTHORIZATION=f"Bearer {a['token']}"), a["bodies"]) for a in agents.values()
    ]
    readings = requests = 0
    began = time.perf_counter()
    while time.perf_counter() - began < seconds:
        client, bodies = clients[requests % len(clients)]
        body = bodies[(requests // len(clients)) % len(bodies)]
        response = client.post(protocol.READINGS_PATH, body, content_type="application/json")
        if response.status_code != 202:
            raise RuntimeError(f"HTTP {response.status_code}: {response.content[:300]!r}")
        readings += response.json()["accepted"]
        requests += 1
    elapsed = time.perf_counter() - began
    connections.close_all()
    return {"readings": readings, "requests": requests, "seconds": elapsed}


def _http_run(agents: dict, seconds: float, processes: int) -> dict:
    from django.db import connections

    connections.close_all()
    with multiprocessing.get_context("fork").Pool(processes) as pool:
        results = pool.map(_http_worker, [(agents, seconds)] * processes)
    return {
        "readings": sum(r["readings"] for r in results),
        "requests": sum(r["requests"] for r in results),
        "seconds": max(r["seconds"] for r in results),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="per phase")
    parser.add_argument("--processes", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--keep", action="store_true", help="keep the samples written")
    args = parser.parse_args()
    calib = calib_s()

    database = _ensure_database(os.environ["DATABASE_URL"])
    agents = _setup()
    from django.conf import settings

    from portal.models import Sample

    service = _service_run(agents, args.seconds)
    http = _http_run(agents, args.seconds, args.processes)
    stored = Sample.objects.filter(node__hostname__in=SPECS).count()
    if not args.keep:
        Sample.objects.filter(node__hostname__in=SPECS).delete()
    service_rate = service["readings"] / service["seconds"]
    http_rate = http["readings"] / http["seconds"]
    print(
        json.dumps(
            {
                "bench": "ingest",
                "database": database,
                "cache": settings.CACHES["default"]["BACKEND"].rsplit(".", 1)[-1],
                "channel_layer": settings.CHANNEL_LAYERS["default"]["BACKEND"].rsplit(".", 1)[-1],
                "batch_sizes": [
                    len(json.loads(a["bodies"][0])["readings"]) for a in agents.values()
                ],
                "seconds_per_phase": args.seconds,
                "service_readings_per_s": round(service_rate),
                "service_batches": service["batches"],
                "http_processes": args.processes,
                "http_readings_per_s": round(http_rate),
                "http_requests_per_s": round(http["requests"] / http["seconds"], 1),
                "rows_stored": stored,
                "rows_expected": service["readings"] + http["readings"],
                "target_readings_per_s": 5000,
                "ok": min(service_rate, http_rate) >= 5000,
                "calib_s": calib,
            }
        )
    )


if __name__ == "__main__":
    main()
