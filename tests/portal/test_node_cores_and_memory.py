"""Cores and host memory per node, reported and held now, as the nodes API and /metrics show
them (what a booking holds on a node is scheduler.resources.node_demand's answer)."""

from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from portal.models import Allocation, Node
from tests.factories import make_active_booking, make_node

pytestmark = pytest.mark.django_db


@pytest.fixture
def site():
    """node-a: 4 GPUs, 96 cores, 1024 GiB; one booking asked 40 cores and 320 GiB for a GPU,
    another asked nothing for two (their share: 48 cores, 512 GiB), a third starts tomorrow.
    node-old reports no cores and memory."""
    node = make_node("node-a", gpus=4)
    Node.objects.filter(pk=node.pk).update(cpus=96, memory_mib=1024 * 1024)
    gpus = list(node.gpus.order_by("index"))
    make_active_booking([gpus[0]], cpus=40, memory_mib=320 * 1024)
    make_active_booking(gpus[1:3])
    later = make_active_booking([gpus[3]], cpus=8, memory_mib=8 * 1024)
    tomorrow = timezone.now() + timedelta(days=1)
    Allocation.objects.filter(booking=later).update(start=tomorrow, end=tomorrow + timedelta(1))
    make_node("node-old", gpus=1)
    return node


def test_it_lists_each_nodes_cores_and_memory_and_what_is_held_now(api, site):
    rows = api.get("/api/v1/nodes/").json()["results"]
    figures = {
        n["hostname"]: (n["cpus"], n["cpus_allocated"], n["memory_mib"], n["memory_mib_allocated"])
        for n in rows
    }
    assert figures == {
        "node-a": (96, 40 + 48, 1024 * 1024, (320 + 512) * 1024),
        "node-old": (None, None, None, None),
    }
    one = api.get(f"/api/v1/nodes/{site.pk}/").json()
    assert (one["cpus_allocated"], one["memory_mib_allocated"]) == (88, 832 * 1024)


def test_it_documents_the_allocated_fields_in_the_schema(api):
    schema = api.get("/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json").json()
    fields = schema["components"]["schemas"]["NodeOutput"]["properties"]
    assert fields["cpus_allocated"]["type"] == "integer" and fields["cpus_allocated"]["nullable"]
    assert fields["memory_mib_allocated"]["type"] == "integer"


def test_it_exports_node_cores_and_memory_gauges(site):
    body = Client().get("/metrics").content.decode()
    samples = {
        (s.name, s.labels.get("node")): s.value
        for family in text_string_to_metric_families(body)
        for s in family.samples
        if s.name.startswith("gpu_portal_node_cpus") or s.name.startswith("gpu_portal_node_mem")
    }
    assert samples == {
        ("gpu_portal_node_cpus", "node-a"): 96,
        ("gpu_portal_node_cpus_allocated", "node-a"): 88,
        ("gpu_portal_node_memory_mib", "node-a"): 1024 * 1024,
        ("gpu_portal_node_memory_mib_allocated", "node-a"): 832 * 1024,
    }
