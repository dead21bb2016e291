"""/metrics (parsed with prometheus_client's own parser), /healthz and /readyz."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime

import psycopg
import pytest
from django.conf import settings as settings_module
from django.db import transaction
from django.test import Client
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from agents.protocol import DeviceReading, ProcessReading, ReadingsRequest
from portal.errors import Busy
from portal.services.allocation.allocation import allocation_pass
from portal.services.core.locking import lock_nodes
from portal.services.fleet.telemetry import samples_ingest
from portal.worker_heartbeat import heartbeat_write
from tests.factories import (
    BookingFactory,
    make_active_booking,
    make_mig_gpu,
    make_node,
    make_shared_booking,
)

pytestmark = pytest.mark.django_db


def _scrape(client=None, **extra) -> dict[str, list]:
    response = (client or Client()).get("/metrics", **extra)
    assert response.status_code == 200, response.content
    assert response["Content-Type"].startswith("text/plain; version=0.0.4")
    return {
        family.name: family.samples
        for family in text_string_to_metric_families(response.content.decode())
    }


def _value(families, name, sample_name=None, **labels):
    found = [
        s.value
        for s in families[name]
        if (sample_name is None or s.name == sample_name)
        and all(s.labels.get(k) == v for k, v in labels.items())
    ]
    assert len(found) == 1, (name, labels, families[name])
    return found[0]


def test_it_exports_device_readings_under_dcgm_names_with_the_holding_project(
    project, user, django_capture_on_commit_callbacks
):
    node = make_node("node-m", gpus=2)
    mig_gpu = make_mig_gpu(node, 2)
    gpu0, gpu1 = node.gpus.order_by("index")[:2]
    slice3g = mig_gpu.mig_instances.get(profile="3g.40gb")
    make_active_booking([gpu0], owner=user, project=project)
    make_active_booking([slice3g], owner=user, project=project, gpus=0, mig_profile="3g.40gb")
    BookingFactory(owner=user, project=project, gpus=4, state="pending")
    readings = [
        DeviceReading(gpu0.uuid, 61.0, 20.0, 30000, 81920, 57.0, 312.5, [], 987_654_321),
        DeviceReading(gpu1.uuid, 0.0, 0.0, 0, 81920, 33.0, 61.0),
        DeviceReading(slice3g.uuid, None, None, 1200, 40960, None, None),
    ]
    with django_capture_on_commit_callbacks(execute=True):
        samples_ingest(
            node=node,
            request=ReadingsRequest(hostname="node-m", time=datetime.now(UTC), readings=readings),
        )

    families = _scrape()

    on_gpu0 = {"uuid": gpu0.uuid, "node": "node-m", "gpu": "0", "project": project.slug}
    assert _value(families, "DCGM_FI_DEV_GPU_UTIL", **on_gpu0, model=gpu0.model) == 61.0
    assert _value(families, "DCGM_FI_DEV_FB_USED", **on_gpu0) == 30000
    assert _value(families, "DCGM_FI_DEV_FB_FREE", **on_gpu0) == 81920 - 30000
    assert _value(families, "DCGM_FI_DEV_POWER_USAGE", **on_gpu0) == 312.5
    assert _value(families, "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", **on_gpu0) == 987_654_321
    assert _value(families, "DCGM_FI_DEV_GPU_UTIL", uuid=gpu1.uuid, project="") == 0.0
    on_slice = {"uuid": slice3g.uuid, "gpu": "2", "mig_profile": "3g.40gb"}
    assert _value(families, "DCGM_FI_DEV_FB_USED", **on_slice, project=project.slug) == 1200
    assert not [s for s in families["DCGM_FI_DEV_GPU_UTIL"] if s.labels["uuid"] == slice3g.uuid]
    # Queue by state and project: an active GPU, an active 3g slice (3/7), 4 GPUs pending.
    assert _value(families, "gpu_portal_bookings", state="active", project=project.slug) == 2
    equivalents = _value(
        families, "gpu_portal_gpu_equivalents", state="active", project=project.slug
    )
    assert equivalents == pytest.approx(1 + 3 / 7, abs=1e-3)
    assert _value(families, "gpu_portal_bookings", state="pending", project=project.slug) == 1
    assert (
        _value(families, "gpu_portal_readings_ingested", "gpu_portal_readings_ingested_total") == 3
    )
    assert _value(families, "gpu_portal_node_up", node="node-m") == 1.0
    assert 0 <= _value(families, "gpu_portal_agent_last_seen_age_seconds", node="node-m") < 3600


def test_it_labels_the_gpu_memory_of_a_shared_gpus_processes_with_their_booking(
    project, user, django_capture_on_commit_callbacks
):
    node = make_node("node-sh", gpus=1)
    gpu = node.gpus.get()
    mine = make_shared_booking(gpu, share=0.5, memory_mib=40960, owner=user, project=project)
    theirs = make_shared_booking(gpu, share=0.5, memory_mib=40960)
    processes = [
        ProcessReading(11, "u", 1000, "a", mine.pk),
        ProcessReading(12, "u", 500, "b", mine.pk),
        ProcessReading(21, "v", 3000, "c", theirs.pk),
        ProcessReading(31, "w", 7000, "d", None),  # no booking named: no booking series
    ]
    readings = [DeviceReading(gpu.uuid, 50.0, 10.0, 11500, 81920, 50.0, 300.0, processes)]
    with django_capture_on_commit_callbacks(execute=True):
        samples_ingest(
            node=node,
            request=ReadingsRequest(hostname="node-sh", time=datetime.now(UTC), readings=readings),
        )

    families = _scrape()

    name = "gpu_portal_gpu_memory_used_by_booking_mib"
    where = {"node": "node-sh", "gpu": "0", "uuid": gpu.uuid}
    assert _value(families, name, **where, booking=str(mine.pk), project=project.slug) == 1500
    assert _value(families, name, **where, booking=str(theirs.pk)) == 3000
    assert len(families[name]) == 2


def test_it_shows_allocation_passes_as_a_histogram(project, cluster):
    before = _scrape()
    count = "gpu_portal_allocation_pass_seconds_count"
    assert _value(before, "gpu_portal_allocation_pass_seconds", count) == 0
    allocation_pass(now=timezone.now())
    allocation_pass(now=timezone.now())
    after = _scrape()
    assert _value(after, "gpu_portal_allocation_pass_seconds", count) == 2
    inf = _value(
        after,
        "gpu_portal_allocation_pass_seconds",
        "gpu_portal_allocation_pass_seconds_bucket",
        le="+Inf",
    )
    assert inf == 2
    assert (
        _value(
            after, "gpu_portal_allocation_pass_seconds", "gpu_portal_allocation_pass_seconds_sum"
        )
        > 0
    )


def test_it_counts_failed_notifications_by_channel(settings, django_capture_on_commit_callbacks):
    from portal.models import NodeAlert
    from portal.services.notify.notifications import alert_notify

    settings.SLACK_WEBHOOK_URL = "http://127.0.0.1:9/hooks/refused"  # nothing listens on 9
    settings.NOTIFY_MAX_ATTEMPTS = 1
    node = make_node("alerting", gpus=1)
    alert = NodeAlert.objects.create(node=node, kind="unbooked_process", time=timezone.now())
    with django_capture_on_commit_callbacks(execute=True):
        alert_notify(alert_id=alert.pk)
    families = _scrape()
    name = "gpu_portal_notification_failures"
    assert _value(families, name, f"{name}_total", channel="slack") == 1
    assert _value(families, name, f"{name}_total", channel="email") == 0


@pytest.mark.django_db(transaction=True)
def test_it_counts_a_lock_timeout_that_answered_busy(settings):
    settings.BOOKING_LOCK_TIMEOUT_MS = 200
    node = make_node("node-lock", gpus=1)
    db = settings.DATABASES["default"]
    from django.db import connection

    holder = psycopg.connect(
        host=db["HOST"], port=db["PORT"], user=db["USER"], dbname=connection.settings_dict["NAME"]
    )
    try:
        holder.execute("SELECT id FROM portal_node WHERE id = %s FOR UPDATE", [node.pk])
        with pytest.raises(Busy), transaction.atomic():
            lock_nodes([node.pk])
    finally:
        holder.rollback()
        holder.close()
    name = "gpu_portal_lock_timeouts"
    assert _value(_scrape(), name, f"{name}_total") == 1


def test_it_refuses_metrics_to_other_addresses_unless_allowed_or_given_the_token(settings):
    far = {"REMOTE_ADDR": "203.0.113.5"}
    response = Client().get("/metrics", **far)
    assert response.status_code == 403
    assert "METRICS_TOKEN" in response.content.decode()
    settings.METRICS_TOKEN = "s3cret-scrape-token"
    assert Client().get("/metrics", HTTP_AUTHORIZATION="Bearer wrong", **far).status_code == 403
    _scrape(HTTP_AUTHORIZATION="Bearer s3cret-scrape-token", **far)
    settings.METRICS_TOKEN = ""
    settings.METRICS_ALLOWED_NETWORKS = ["203.0.113.0/24"]
    _scrape(**far)
    # A forged X-Forwarded-For does not make a far client local (no trusted proxy by default).
    settings.METRICS_ALLOWED_NETWORKS = []
    assert Client().get("/metrics", HTTP_X_FORWARDED_FOR="127.0.0.1", **far).status_code == 403


def test_it_answers_healthz_without_touching_the_database(django_assert_num_queries):
    with django_assert_num_queries(0):
        response = Client().get("/healthz")
    assert response.status_code == 200 and response.json() == {"status": "ok"}


def test_it_is_ready_only_after_an_allocation_pass_and_names_what_is_missing(settings):
    response = Client().get("/readyz")
    assert response.status_code == 503 and response["Retry-After"] == "5"
    body = response.json()
    assert body["status"] == "not ready"
    assert body["checks"]["database"]["ok"] and body["checks"]["redis"]["ok"]
    assert body["checks"]["allocation_pass"] == {
        **body["checks"]["allocation_pass"],
        "ok": False,
        "detail": "no allocation pass has run yet",
    }
    allocation_pass(now=timezone.now())
    assert Client().get("/readyz").json()["checks"]["worker"]["ok"] is False
    heartbeat_write([settings.CELERY_PASS_QUEUE])  # as a worker on the pass queue does
    response = Client().get("/readyz")
    assert response.status_code == 200, response.json()
    assert response.json()["status"] == "ready"
    assert response.json()["checks"]["agents"]["detail"] == "0 of 0 node(s) up"


def test_it_is_not_ready_while_redis_is_unreachable(settings):
    allocation_pass(now=timezone.now())
    heartbeat_write([settings.CELERY_PASS_QUEUE])
    cache = settings.CACHES["default"]
    settings.CACHES = {"default": {**cache, "LOCATION": "redis://127.0.0.1:9/0"}}
    response = Client().get("/readyz")
    assert response.status_code == 503
    checks = response.json()["checks"]
    assert checks["database"]["ok"] and not checks["redis"]["ok"]
    assert "Error" in checks["redis"]["detail"]


def test_it_ships_a_grafana_dashboard_that_queries_only_metrics_it_exports():
    dashboard = json.loads((settings_module.BASE_DIR / "docs/grafana/gpu-portal.json").read_text())
    exprs = [t["expr"] for panel in dashboard["panels"] for t in panel["targets"]]
    exprs += [v["query"] for v in dashboard["templating"]["list"] if v["type"] == "query"]
    queried = {
        re.sub(r"_(bucket|total|count|sum)$", "", name)
        for expr in exprs
        for name in re.findall(r"\b(?:DCGM_FI_DEV_\w+|gpu_portal_\w+)", expr)
    }
    exported = set(_scrape())
    assert queried and queried <= exported, queried - exported
    assert {"DCGM_FI_DEV_GPU_UTIL", "gpu_portal_allocation_pass_seconds"} <= queried
