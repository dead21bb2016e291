"""What one node may send in one request is bounded (a 400 naming the list and the limit);
names refuse control characters; times far ahead of the portal's clock are refused; a flood
of alerts sends a few messages, not one per alert, and repeats count on one row per process."""

import copy
from datetime import timedelta

import pytest

from agents import protocol
from portal.models import Delivery, Gpu, NodeAlert, Notification
from tests.conftest import error_of
from tests.factories import UserFactory
from tests.portal_agent.conftest import reading
from tests.portal_agent.test_agent_api import REGISTER

pytestmark = pytest.mark.django_db


def _gpu(i: int) -> dict:
    return {
        "index": i,
        "uuid": f"GPU-flood-{i}",
        "model": "H100-80GB",
        "memory_total_mib": 81920,
        "mig_mode": False,
        "mig_instances": [],
    }


def test_it_refuses_a_register_with_more_gpus_than_a_node_has_room_for(node_a, agent_a):
    body = {**REGISTER, "gpus": [_gpu(i) for i in range(protocol.MAX_GPUS + 1)]}
    response = agent_a.post(protocol.REGISTER_PATH, body)
    assert response.status_code == 400
    error = error_of(response)
    assert f"at most {protocol.MAX_GPUS}" in error["fields"]["gpus"]
    assert not Gpu.objects.filter(uuid__startswith="GPU-flood-").exists()


def test_it_refuses_a_batch_of_more_events_than_the_limit(node_a, agent_a):
    flood = [
        {"kind": "unbooked_process", "time": protocol.utcnow().isoformat(), "pid": i}
        for i in range(5000)
    ]
    response = agent_a.events(*flood)
    assert response.status_code == 400
    assert f"at most {protocol.MAX_EVENTS}" in error_of(response)["fields"]["events"]
    assert not NodeAlert.objects.exists()


def test_it_refuses_more_readings_than_a_node_has_devices_room_for(node_a, agent_a):
    readings = [reading(f"GPU-x-{i}") for i in range(protocol.MAX_READINGS + 1)]
    response = agent_a.readings("node-a", readings, time=protocol.utcnow().isoformat())
    assert response.status_code == 400
    assert f"at most {protocol.MAX_READINGS}" in error_of(response)["fields"]["readings"]


@pytest.mark.parametrize("model", ["H100\r\nBcc: all@example.org", "A100\x1b[31m", "H100\x7f"])
def test_it_refuses_a_model_with_control_characters(node_a, agent_a, model):
    body = copy.deepcopy(REGISTER)
    body["gpus"][0]["model"] = model
    response = agent_a.post(protocol.REGISTER_PATH, body)
    assert response.status_code == 400
    assert error_of(response)["fields"]["gpus[0].model"] == "must not contain control characters"


def test_it_keeps_line_breaks_and_colours_in_free_text(node_a, agent_a):
    event = {
        "kind": "unbooked_process",
        "time": protocol.utcnow().isoformat(),
        "detail": "line one\nline two\t\x1b[31mred\x1b[0m",
    }
    assert agent_a.events(event).status_code == 202
    assert NodeAlert.objects.get().detail.startswith("line one\nline two")


def test_it_refuses_readings_and_events_stamped_far_in_the_future(node_a, agent_a):
    future = "9999-12-31T23:59:59Z"
    response = agent_a.readings("node-a", [], time=future)
    assert response.status_code == 400 and "ahead of the portal's clock" in str(
        error_of(response)["fields"]["time"]
    )
    soon = (protocol.utcnow() + timedelta(seconds=60)).isoformat()  # a little skew is fine
    event = {"kind": "unbooked_process", "time": future}
    response = agent_a.events({"kind": "unbooked_process", "time": soon}, event)
    assert response.status_code == 400
    assert "events[1].time" in error_of(response)["fields"]
    assert not NodeAlert.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_it_sends_a_few_messages_for_a_flood_of_alerts(node_a, agent_a, settings):
    UserFactory(username="root", is_staff=True, is_superuser=True, email="root@example.org")
    batch = [
        {"kind": "unbooked_process", "time": protocol.utcnow().isoformat(), "pid": i}
        for i in range(protocol.MAX_EVENTS)
    ]
    for _ in range(3):
        assert agent_a.events(*batch).status_code == 202
    # One row per process, whatever the repeats: a request adds at most MAX_EVENTS rows.
    assert NodeAlert.objects.count() == protocol.MAX_EVENTS
    assert set(NodeAlert.objects.values_list("count", flat=True)) == {3}
    assert Notification.objects.count() == 1  # one message for the node and kind
    assert Delivery.objects.count() <= 2
    foreign = {"kind": "foreign_process", "time": protocol.utcnow().isoformat(), "pid": 1}
    assert agent_a.events(foreign).status_code == 202
    assert Notification.objects.count() == 2  # another kind is told


@pytest.mark.django_db(transaction=True)
def test_it_merges_the_repeated_alerts_stored_before_when_migrating():
    from django.db import connection
    from django.db.migrations.executor import MigrationExecutor
    from django.utils import timezone

    before, after = (
        ("portal", "0024_gpu_topology_node_network_group"),
        ("portal", "0025_nodealert_one_per_process"),
    )
    executor = MigrationExecutor(connection)
    executor.migrate([before])
    apps = executor.loader.project_state([before]).apps
    try:
        node = apps.get_model("portal", "Node").objects.create(hostname="old")
        Alert = apps.get_model("portal", "NodeAlert")
        t0 = timezone.now() - timedelta(hours=1)
        for minute in (5, 0, 9):  # the same process three times, then another once
            Alert.objects.create(
                node=node, kind="unbooked_process", pid=7, time=t0 + timedelta(minutes=minute)
            )
        Alert.objects.create(node=node, kind="unbooked_process", pid=8, time=t0)
        executor = MigrationExecutor(connection)
        executor.loader.build_graph()
        executor.migrate([after])
    finally:
        MigrationExecutor(connection).migrate(executor.loader.graph.leaf_nodes())
    merged = NodeAlert.objects.order_by("pid")
    assert [(a.pid, a.count, a.time, a.last_seen) for a in merged] == [
        (7, 3, t0, t0 + timedelta(minutes=9)),
        (8, 1, t0, t0),
    ]
