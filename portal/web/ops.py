"""Endpoints for the site's operators' tools: Prometheus (/metrics) and health checks.

/metrics answers loopback and the networks in METRICS_ALLOWED_NETWORKS; anyone else needs
`Authorization: Bearer <METRICS_TOKEN>`. /healthz says the process serves; /readyz checks what
serving needs (database, Redis, a recent allocation pass) and reports the agents.
"""

from __future__ import annotations

import hmac
import ipaddress
import time

from django.conf import settings
from django.core.cache import cache
from django.db import connection
from django.db.models import Count, Q
from django.http import HttpResponse, JsonResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder

from portal.models import Node
from portal.services.access.login_throttle import client_address
from portal.services.core import counters
from portal.services.reporting import metrics
from portal.worker_heartbeat import heartbeat_age


def _metrics_allowed(request) -> bool:
    token = settings.METRICS_TOKEN
    header = request.META.get("HTTP_AUTHORIZATION", "")
    if token and header.startswith("Bearer "):
        return hmac.compare_digest(header.removeprefix("Bearer ").strip(), token)
    try:
        address = ipaddress.ip_address(client_address(request))
    except ValueError:
        return False
    if address.is_loopback:
        return True
    return any(
        address in ipaddress.ip_network(net, strict=False)
        for net in settings.METRICS_ALLOWED_NETWORKS
    )


@never_cache
@require_GET
def prometheus_metrics(request):
    """The Prometheus text format, collected now from the cache and the database."""
    if not _metrics_allowed(request):
        response = HttpResponse(
            "403 Forbidden: /metrics answers loopback, METRICS_ALLOWED_NETWORKS, or a bearer "
            "token (METRICS_TOKEN).\n",
            status=403,
            content_type="text/plain",
        )
        response["WWW-Authenticate"] = "Bearer"
        return response
    registry = CollectorRegistry(auto_describe=False)
    registry.register(metrics.PortalCollector())
    # The format the scraper asks for (Prometheus sends Accept); plain text 0.0.4 by default.
    encode, content_type = choose_encoder(request.META.get("HTTP_ACCEPT", ""))
    return HttpResponse(encode(registry), content_type=content_type)


@never_cache
@require_GET
def healthz(request):
    """The process is up and answering; touches nothing else."""
    return JsonResponse({"status": "ok"})


@never_cache
@require_GET
def readyz(request):
    """200 when the database, the cache and the allocation pass work; else 503 naming what."""
    checks = {
        "database": _check(_database),
        "redis": _check(_redis),
        "allocation_pass": _check(_allocation_pass),
        "worker": _check(_worker),
        "agents": _check(_agents),
    }
    ready = all(checks[name]["ok"] for name in ("database", "redis", "allocation_pass", "worker"))
    response = JsonResponse(
        {"status": "ready" if ready else "not ready", "checks": checks},
        status=200 if ready else 503,
    )
    if not ready:
        response["Retry-After"] = "5"
    return response


def _check(probe) -> dict:
    started = time.perf_counter()
    try:
        ok, detail = probe()
    except Exception as exc:  # a health check reports failures; it must not raise them
        ok, detail = False, f"{type(exc).__name__}: {exc}"
    return {"ok": ok, "detail": detail, "ms": round((time.perf_counter() - started) * 1000, 1)}


def _database() -> tuple[bool, str]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
        cursor.fetchone()
    return True, connection.vendor


def _redis() -> tuple[bool, str]:
    if not settings.REDIS_URL:
        return True, "embedded mode: in-process cache"
    key = "readyz:probe"
    cache.set(key, 1, timeout=10)
    return cache.get(key) == 1, "set and read back"


def _allocation_pass() -> tuple[bool, str]:
    last = counters.last_pass_at()
    if last is None:
        return False, "no allocation pass has run yet"
    age = time.time() - last
    limit = settings.READY_PASS_MAX_AGE_S
    return age <= limit, f"last pass {age:.0f} s ago (limit {limit:.0f} s)"


def _worker() -> tuple[bool, str]:
    if not settings.REDIS_URL:
        return True, "embedded mode: the pass runs in-process"
    age = heartbeat_age(settings.CELERY_PASS_QUEUE)
    limit = settings.READY_WORKER_MAX_AGE_S
    if age is None:
        return False, f"no worker consumes the queue {settings.CELERY_PASS_QUEUE!r}"
    return (
        age <= limit,
        f"a worker on {settings.CELERY_PASS_QUEUE!r} {age:.0f} s ago (limit {limit:.0f} s)",
    )


def _agents() -> tuple[bool, str]:
    # Reported, not required: a new site is ready before its first node joins.
    counts = Node.objects.aggregate(
        up=Count("id", filter=Q(state=Node.State.UP)), total=Count("id")
    )
    up, total = counts["up"], counts["total"]
    return total == 0 or up > 0, f"{up} of {total} node(s) up"
