"""The agent endpoints over HTTP: auth, register, readings, desired state, events."""

import json
from datetime import timedelta

import pytest
from django.core import mail
from django.utils import timezone
from rest_framework.test import APIClient

from agents import protocol
from portal.models import Booking, Gpu, MigInstance, Node, NodeAlert, Sample
from portal.services.inventory.telemetry_cache import latest_by_uuid
from tests.conftest import error_of
from tests.factories import UserFactory, make_active_booking, node_seen
from tests.portal_agent.conftest import AgentClient, reading

pytestmark = pytest.mark.django_db

REGISTER = {
    "hostname": "node-a",
    "agent_version": "0.1.0",
    "protocol": 1,
    "gpus": [
        {
            "index": 0,
            "uuid": "GPU-new-0",
            "model": "NVIDIA H100-80GB",
            "memory_total_mib": 81920,
            "mig_mode": True,
            "mig_instances": [
                {
                    "uuid": "MIG-new-0a",
                    "profile": "3g.40gb",
                    "slices": 3,
                    "memory_total_mib": 40960,
                },
                {
                    "uuid": "MIG-new-0b",
                    "profile": "2g.20gb",
                    "slices": 2,
                    "memory_total_mib": 20480,
                },
            ],
        },
        {
            "index": 1,
            "uuid": "GPU-new-1",
            "model": "NVIDIA H100-80GB",
            "memory_total_mib": 81920,
            "mig_mode": False,
            "mig_instances": [],
        },
    ],
}


def _uuids(node):
    gpus = list(Gpu.objects.filter(node=node).order_by("index").values_list("uuid", flat=True))
    migs = list(
        MigInstance.objects.filter(gpu__node=node).order_by("uuid").values_list("uuid", flat=True)
    )
    return gpus, migs


# -- auth ----------------------------------------------------------------------------------


def test_it_refuses_requests_without_a_token(node_a):
    response = APIClient().get(protocol.DESIRED_PATH)
    assert response.status_code == 401
    assert error_of(response)["code"] == "not_authenticated"


def test_it_refuses_a_revoked_token(node_a):
    from portal.services.fleet.nodes import node_token_revoke

    node_token_revoke(hostname="node-a")
    response = AgentClient(node_a[1]).get(protocol.DESIRED_PATH)
    assert response.status_code == 401
    assert error_of(response)["code"] == "authentication_failed"


def test_it_refuses_readings_for_another_node_and_stores_nothing(node_a, node_b, agent_a):
    uuid = node_b[0].gpus.get().uuid
    response = agent_a.readings("node-b", [reading(uuid, utilization_gpu=10.0)])
    assert response.status_code == 403
    assert error_of(response)["fields"] == {"hostname": "not the node this token belongs to"}
    assert Sample.objects.count() == 0
    assert latest_by_uuid([uuid]) == {}


def test_it_refuses_a_reading_of_a_device_of_another_node(node_a, node_b, agent_a):
    own = node_a[0].gpus.first().uuid
    foreign = node_b[0].gpus.get().uuid
    response = agent_a.readings("node-a", [reading(own), reading(foreign)])
    assert response.status_code == 400
    assert list(error_of(response)["fields"]) == ["readings[1].uuid"]
    assert Sample.objects.count() == 0


def test_it_refuses_inventory_for_another_node(node_a, node_b, agent_a):
    response = agent_a.post(protocol.REGISTER_PATH, {**REGISTER, "hostname": "node-b"})
    assert response.status_code == 403
    assert _uuids(node_b[0])[0] == [node_b[0].gpus.get().uuid]


def test_it_refuses_to_move_another_nodes_gpu_to_this_node(node_a, node_b, agent_a):
    body = json.loads(json.dumps(REGISTER))
    body["gpus"][1]["uuid"] = node_b[0].gpus.get().uuid
    response = agent_a.post(protocol.REGISTER_PATH, body)
    assert response.status_code == 403
    assert error_of(response)["fields"] == {"gpus[1].uuid": "a device of another node"}
    assert Gpu.objects.get(uuid=body["gpus"][1]["uuid"]).node == node_b[0]


def test_it_counts_any_request_as_a_heartbeat_and_brings_a_down_node_up(node_a, agent_a):
    Node.objects.filter(pk=node_a[0].pk).update(state=Node.State.DOWN, state_reason="silent")
    node_seen(node_a[0], timezone.now() - timedelta(hours=1))
    assert agent_a.get(protocol.DESIRED_PATH).status_code == 200
    node = Node.objects.get(pk=node_a[0].pk)
    assert node.state == Node.State.UP and node.state_reason == ""
    assert timezone.now() - node.heartbeat.last_seen < timedelta(seconds=5)


# -- register ------------------------------------------------------------------------------


def test_it_registers_inventory_with_mig_and_answers_the_settings(node_a, agent_a, settings):
    settings.AGENT_ENFORCEMENT = "warn"
    response = agent_a.post(protocol.REGISTER_PATH, REGISTER)
    assert response.status_code == 200
    assert response.json() == {
        "node": "node-a",
        "report_interval_s": settings.AGENT_REPORT_INTERVAL_S,
        "sync_interval_s": settings.AGENT_SYNC_INTERVAL_S,
        "enforcement": "warn",
    }
    assert _uuids(node_a[0]) == (["GPU-new-0", "GPU-new-1"], ["MIG-new-0a", "MIG-new-0b"])
    gpu = Gpu.objects.get(uuid="GPU-new-0")
    assert gpu.mig_mode and gpu.model == "H100-80GB"  # the vendor prefix is dropped
    assert MigInstance.objects.get(uuid="MIG-new-0a").slices == 3
    assert Node.objects.get(pk=node_a[0].pk).agent_version == "0.1.0"


def test_it_updates_inventory_on_a_second_register(node_a, agent_a):
    agent_a.post(protocol.REGISTER_PATH, REGISTER)
    body = json.loads(json.dumps(REGISTER))
    body["gpus"][0]["mig_instances"].pop()
    body["gpus"][1]["memory_total_mib"] = 40960
    assert agent_a.post(protocol.REGISTER_PATH, body).status_code == 200
    assert _uuids(node_a[0]) == (["GPU-new-0", "GPU-new-1"], ["MIG-new-0a"])
    assert Gpu.objects.get(uuid="GPU-new-1").memory_mib == 40960


def test_it_keeps_the_container_runtimes_the_agent_reports(node_a, agent_a):
    body = {**REGISTER, "container_runtimes": ["apptainer", "podman", "lxc"]}
    assert agent_a.post(protocol.REGISTER_PATH, body).status_code == 200
    # Known names only, in the portal's order; an agent that reports none offers none.
    assert Node.objects.get(pk=node_a[0].pk).runtimes() == ("podman", "apptainer")
    assert agent_a.post(protocol.REGISTER_PATH, REGISTER).status_code == 200
    assert Node.objects.get(pk=node_a[0].pk).runtimes() == ()


def _register_with(path: list, value) -> dict:
    body = json.loads(json.dumps(REGISTER))
    target = body
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return body


@pytest.mark.parametrize(
    ("path", "value", "field"),
    [
        (
            ["gpus", 0, "mig_instances", 0, "profile"],
            "3g." + "x" * 30,
            "gpus[0].mig_instances[0].profile",
        ),
        (["agent_version"], "1" * 65, "agent_version"),
        (["gpus", 0, "model"], "NVIDIA\x00H100", "gpus[0].model"),
        (["hostname"], "node-a\x00", "hostname"),
        (["gpus", 0, "mig_instances", 0, "slices"], 0, "gpus[0].mig_instances[0].slices"),
        (["gpus", 0, "mig_instances", 0, "slices"], 100, "gpus[0].mig_instances[0].slices"),
        (["gpus", 1, "uuid"], "GPU-new-0", "gpus[1].uuid"),
        (["gpus", 0, "mig_instances", 1, "uuid"], "MIG-new-0a", "gpus[0].mig_instances[1].uuid"),
        (["gpus", 1, "uuid"], "MIG-new-0b", "gpus[1].uuid"),
    ],
)
def test_it_refuses_a_bad_inventory_naming_the_field_and_stores_nothing(
    node_a, agent_a, path, value, field
):
    before = _uuids(node_a[0])
    response = agent_a.post(protocol.REGISTER_PATH, _register_with(path, value))
    assert response.status_code == 400, response.content
    assert field in error_of(response)["fields"], error_of(response)
    assert _uuids(node_a[0]) == before
    assert Node.objects.get(pk=node_a[0].pk).agent_version != value


@pytest.mark.parametrize(
    ("path", "value", "field"),
    [
        (["address"], "10.9.9.9 --nproc-per-node=999", "address"),
        (["address"], "10.9.9.9;reboot", "address"),
        (["address"], "-master", "address"),
        (["hostname"], "node-a slots=99", "hostname"),
        (["hostname"], "node_a", "hostname"),
    ],
)
def test_it_refuses_an_address_or_name_that_is_no_host_naming_the_field(
    node_a, agent_a, path, value, field
):
    response = agent_a.post(protocol.REGISTER_PATH, _register_with(path, value))
    assert response.status_code == 400, response.content
    assert set(error_of(response)["fields"]) == {field}, error_of(response)
    node = Node.objects.get(pk=node_a[0].pk)
    assert node.address != value and not node.agent_version


@pytest.mark.parametrize("address", ["10.0.0.7", "fd00::7", "gpu-a01.cluster.example"])
def test_it_keeps_an_ip_address_or_a_host_name_as_the_nodes_address(node_a, agent_a, address):
    response = agent_a.post(protocol.REGISTER_PATH, {**REGISTER, "address": address})
    assert response.status_code == 200, response.content
    assert Node.objects.get(pk=node_a[0].pk).address == address


# -- readings ------------------------------------------------------------------------------


def test_it_stores_readings_in_the_database_and_the_cache(
    node_a, agent_a, django_capture_on_commit_callbacks
):
    node = node_a[0]
    gpu = node.gpus.filter(mig_mode=False).first()
    mig = MigInstance.objects.filter(gpu__node=node).first()
    whole = reading(
        gpu.uuid, utilization_gpu=87.5, utilization_memory=40.0, temperature_c=61.0, power_w=350.5
    )
    with django_capture_on_commit_callbacks(execute=True):
        response = agent_a.readings(
            "node-a", [whole, reading(mig.uuid)], time="2026-01-01T10:00:00Z"
        )
    assert response.status_code == 202
    assert response.json() == {"accepted": 2}
    stored = {s.uuid: s for s in Sample.objects.all()}
    assert stored[gpu.uuid].utilization_gpu == 87.5 and stored[gpu.uuid].power_w == 350.5
    assert stored[gpu.uuid].node_id == node.pk
    assert stored[mig.uuid].utilization_gpu is None  # not measured, never 0
    assert stored[mig.uuid].memory_used_mib == 512
    latest = latest_by_uuid([gpu.uuid, mig.uuid])
    assert latest[gpu.uuid]["utilization_gpu"] == 87.5
    assert latest[gpu.uuid]["time"] == "2026-01-01T10:00:00Z"
    assert latest[mig.uuid]["utilization_gpu"] is None


@pytest.mark.parametrize(
    ("body", "field"),
    [
        (b"{not json", "body"),
        (b"[]", "body"),
        ({"time": "2026-01-01T00:00:00Z", "readings": []}, "hostname"),
        ({"hostname": "node-a", "time": "yesterday", "readings": []}, "time"),
        ({"hostname": "node-a", "time": "2026-01-01T00:00:00", "readings": []}, "time"),
        ({"hostname": "node-a", "time": "2026-01-01T00:00:00Z", "readings": {}}, "readings"),
        ({"hostname": "node-a", "time": "2026-01-01T00:00:00Z", "readings": [], "x": 1}, "x"),
    ],
)
def test_it_refuses_bad_batches_naming_the_field(node_a, agent_a, body, field):
    response = agent_a.post(protocol.READINGS_PATH, body)
    assert response.status_code == 400
    assert field in error_of(response)["fields"]


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"utilization_gpu": "high"}, "readings[1].utilization_gpu"),
        ({"memory_used_mib": 1.5}, "readings[1].memory_used_mib"),
        ({"memory_used_mib": True}, "readings[1].memory_used_mib"),
        ({"memory_used_mib": 10**30}, "readings[1].memory_used_mib"),
        ({"power_w": 1e300}, "readings[1].power_w"),
        ({"utilization_gpu": 250.0}, "readings[1].utilization_gpu"),
        ({"memory_used_mib": -1}, "readings[1].memory_used_mib"),
        ({"uuid": "X" * 200}, "readings[1].uuid"),
        ({"surprise": 1}, "readings[1].surprise"),
        (
            {"processes": [{"pid": 1, "user": "a", "used_memory_mib": 1}]},
            "readings[1].processes[0].name",
        ),
        (
            {"processes": [{"pid": 1, "user": "a", "used_memory_mib": 1, "name": "x", "y": 2}]},
            "readings[1].processes[0].y",
        ),
    ],
)
def test_it_refuses_a_bad_reading_and_stores_none_of_the_batch(node_a, agent_a, change, field):
    uuids = [g.uuid for g in node_a[0].gpus.filter(mig_mode=False)]
    batch = [reading(uuids[0], utilization_gpu=1.0), {**reading(uuids[1]), **change}]
    response = agent_a.readings("node-a", batch)
    assert response.status_code == 400
    assert field in error_of(response)["fields"], error_of(response)
    assert Sample.objects.count() == 0
    assert latest_by_uuid(uuids) == {}


def test_it_refuses_nan_and_infinity(node_a, agent_a):
    uuid = node_a[0].gpus.first().uuid
    raw = json.dumps(
        {"hostname": "node-a", "time": "2026-01-01T00:00:00Z", "readings": [reading(uuid)]}
    )
    response = agent_a.post(
        protocol.READINGS_PATH, raw.replace('"power_w": null', '"power_w": NaN')
    )
    assert response.status_code == 400
    assert "body" in error_of(response)["fields"]
    assert Sample.objects.count() == 0


# -- desired state -------------------------------------------------------------------------


def test_it_lists_only_this_nodes_active_bookings(node_a, node_b, agent_a):
    gpu, other_gpu = node_a[0].gpus.filter(mig_mode=False)
    mig = MigInstance.objects.filter(gpu__node=node_a[0]).first()
    owner = UserFactory(username="bob")
    mine = make_active_booking([gpu], owner=owner, command="python train.py")
    on_mig = make_active_booking([mig], owner=owner)
    make_active_booking([node_b[0].gpus.get()])  # another node's
    ended = make_active_booking([other_gpu])
    Booking.objects.filter(pk=ended.pk).update(state=Booking.State.FINISHED)

    response = agent_a.get(protocol.DESIRED_PATH)
    assert response.status_code == 200
    desired = protocol.from_json(protocol.DesiredState, response.json())
    assert [(b.booking_id, b.owner, b.device_uuids, b.command) for b in desired.bookings] == [
        (mine.pk, "bob", [gpu.uuid], "python train.py"),
        (on_mig.pk, "bob", [mig.uuid], None),
    ]
    assert desired.bookings[0].start < timezone.now() < desired.bookings[0].end


def test_it_changes_the_generation_when_desired_state_changes(node_a, agent_a):
    gpu = node_a[0].gpus.first()
    before = agent_a.get(protocol.DESIRED_PATH).json()["generation"]
    assert agent_a.get(protocol.DESIRED_PATH).json()["generation"] == before
    make_active_booking([gpu])
    after = agent_a.get(protocol.DESIRED_PATH).json()["generation"]
    assert after != before and isinstance(after, int) and 0 <= after < 2**53


# -- events --------------------------------------------------------------------------------


def _exited(booking, code, tail="hello\n"):
    return {
        "kind": "exited",
        "time": timezone.now().isoformat(),
        "detail": "exited",
        "booking_id": booking.pk,
        "exit_code": code,
        "log_tail": tail,
    }


@pytest.mark.parametrize(("code", "state"), [(0, "finished"), (3, "failed")])
def test_it_ends_a_batch_booking_when_its_command_exits(node_a, agent_a, code, state):
    booking = make_active_booking([node_a[0].gpus.first()], command="sh -c 'exit 3'")
    response = agent_a.events(_exited(booking, code, tail="step 9\nbye\n"))
    assert response.status_code == 202
    assert response.json() == {"accepted": 1}
    booking.refresh_from_db()
    assert booking.state == state
    assert booking.exit_code == code
    assert booking.log_tail == "step 9\nbye\n"
    assert booking.state_detail == f"command exited with code {code}"
    assert not booking.allocations.filter(live=True).exists()


def test_it_refuses_events_about_another_nodes_booking(node_a, node_b, agent_a):
    theirs = make_active_booking([node_b[0].gpus.get()], command="x")
    response = agent_a.events(_exited(theirs, 0))
    assert response.status_code == 403
    assert error_of(response)["fields"] == {"events[0].booking_id": "not a booking on this node"}
    theirs.refresh_from_db()
    assert theirs.state == "active" and theirs.exit_code is None


def test_it_refuses_a_whole_event_batch_when_one_event_is_bad(node_a, agent_a):
    booking = make_active_booking([node_a[0].gpus.first()], command="x")
    bad = {"kind": "exploded", "time": timezone.now().isoformat()}
    response = agent_a.events(_exited(booking, 0), bad)
    assert response.status_code == 400
    assert "events[1].kind" in error_of(response)["fields"]
    booking.refresh_from_db()
    assert booking.state == "active"


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"detail": "bad\x00byte"}, "events[0].detail"),
        ({"log_tail": "out\x00put"}, "events[0].log_tail"),
        ({"user": "x" * 65}, "events[0].user"),
    ],
)
def test_it_refuses_an_event_with_a_nul_byte_or_an_overlong_field(node_a, agent_a, change, field):
    booking = make_active_booking([node_a[0].gpus.first()], command="x")
    response = agent_a.events({**_exited(booking, 0), **change})
    assert response.status_code == 400, response.content
    assert field in error_of(response)["fields"], error_of(response)
    booking.refresh_from_db()
    assert booking.state == "active" and booking.exit_code is None


def test_it_stores_a_foreign_process_and_notifies_owner(
    node_a, agent_a, django_capture_on_commit_callbacks
):
    gpu = node_a[0].gpus.first()
    owner = UserFactory(username="carol", email="carol@example.org")
    booking = make_active_booking([gpu], owner=owner)
    event = {
        "kind": "foreign_process",
        "time": timezone.now().isoformat(),
        "detail": f"process 4242 (python) of mallory uses {gpu.uuid}, booked by carol",
        "booking_id": booking.pk,
        "device_uuid": gpu.uuid,
        "pid": 4242,
        "user": "mallory",
        "action": "warn",
    }
    with django_capture_on_commit_callbacks(execute=True):
        response = agent_a.events(event)
    assert response.status_code == 202
    alert = NodeAlert.objects.get()
    assert (alert.kind, alert.pid, alert.user, alert.action) == (
        "foreign_process",
        4242,
        "mallory",
        "warn",
    )
    assert alert.booking == booking and alert.owner == owner and alert.node == node_a[0]
    assert [m.to for m in mail.outbox] == [["carol@example.org"]]
    assert "mallory" in mail.outbox[0].body


@pytest.mark.both_databases
def test_it_counts_a_repeated_process_on_one_alert_and_tells_its_owner_once(
    node_a, agent_a, django_capture_on_commit_callbacks
):
    gpu = node_a[0].gpus.first()
    owner = UserFactory(username="dave", email="dave@example.org")
    booking = make_active_booking([gpu], owner=owner)
    first = timezone.now() - timedelta(minutes=3)
    event = {
        "kind": "foreign_process",
        "detail": "process 4242 (python) of mallory",
        "booking_id": booking.pk,
        "device_uuid": gpu.uuid,
        "pid": 4242,
        "user": "mallory",
        "action": "report",
    }
    for minute, action in ((0, "report"), (2, "report"), (1, "kill")):  # one arrives late
        moment = (first + timedelta(minutes=minute)).isoformat()
        with django_capture_on_commit_callbacks(execute=True):
            response = agent_a.events({**event, "time": moment, "action": action})
        assert response.status_code == 202
    alert = NodeAlert.objects.get()
    assert (alert.count, alert.time, alert.last_seen) == (3, first, first + timedelta(minutes=2))
    assert alert.action == "kill"  # the latest report's
    assert [m.to for m in mail.outbox] == [["dave@example.org"]]
    # Another process, or the same pid on another device or of another user, is another alert.
    others = [{"pid": 4243}, {"user": "eve"}, {"booking_id": None, "kind": "unbooked_process"}]
    now = timezone.now().isoformat()
    assert agent_a.events(*[{**event, "time": now, **o} for o in others]).status_code == 202
    assert NodeAlert.objects.count() == 4


@pytest.mark.django_db(transaction=True)
def test_it_makes_one_alert_of_two_racing_reports_of_a_process(node_a):
    import threading

    from django.db import connection, transaction

    from portal.services.fleet.alerts import node_alert_record

    if connection.vendor != "postgresql":
        pytest.skip("a race between connections: PostgreSQL's (SQLite writes one at a time)")
    barrier, seen = threading.Barrier(2), []

    def report() -> None:
        try:
            with transaction.atomic():
                barrier.wait(timeout=10)
                seen.append(
                    node_alert_record(
                        node=node_a[0],
                        kind="unbooked_process",
                        time=timezone.now(),
                        now=timezone.now(),
                        booking=None,
                        device_uuid="GPU-race",
                        pid=99,
                        user="eve",
                        action="report",
                        detail="race",
                    )
                )
        finally:
            connection.close()

    threads = [threading.Thread(target=report) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert NodeAlert.objects.get().count == 2
    assert sorted(s.new for s in seen) == [False, True]


def test_it_stores_an_unbooked_process_without_mailing_anyone(
    node_a, agent_a, django_capture_on_commit_callbacks
):
    gpu = node_a[0].gpus.first()
    event = {
        "kind": "unbooked_process",
        "time": timezone.now().isoformat(),
        "device_uuid": gpu.uuid,
        "pid": 7,
        "user": "eve",
        "action": "kill",
    }
    with django_capture_on_commit_callbacks(execute=True) as callbacks:
        assert agent_a.events(event).status_code == 202
    alert = NodeAlert.objects.get()
    assert alert.kind == "unbooked_process" and alert.booking is None
    assert callbacks  # the site's admins are told (their channels, the site's Slack)
    assert mail.outbox == []  # no booking, so no owner; no admin in this test


def test_it_fails_a_batch_booking_whose_command_was_never_launched(node_a, agent_a):
    booking = make_active_booking([node_a[0].gpus.first()], command="x")
    detail = "not launched: Unix user 'zoe' (portal user 'zoe') does not exist on this node"
    assert (
        agent_a.events({**_exited(booking, None, tail=None), "detail": detail}).status_code == 202
    )
    booking.refresh_from_db()
    assert (booking.state, booking.state_detail, booking.exit_code) == ("failed", detail, None)


# (the event's kind, detail and interrupted, as agents send them) -> the reason on the booking
INTERRUPTED = [
    (
        ("stopped", "stopped: the node's agent stopped while it ran", "agent_stopped"),
        "the node's agent stopped while it ran (node node-a)",
    ),
    (
        ("exited", "ended unwatched: it ended while no agent watched it", "unwatched"),
        "it ended while the node's agent was not running, with no exit status (node node-a)",
    ),
    (  # an agent older than exit files: a re-adopted job's end, no status, no interruption
        ("exited", "exited (re-adopted after an agent restart)", None),
        "it ended while the node's agent was not running, with no exit status (node node-a)",
    ),
]


def _interrupted(booking, kind: str, detail: str, interrupted: str | None, code=None) -> dict:
    event = {**_exited(booking, code, tail="step 3\n"), "kind": kind, "detail": detail}
    return {**event, "interrupted": interrupted} if interrupted else event


@pytest.mark.parametrize(("event", "reason"), INTERRUPTED)
def test_it_requeues_a_batch_job_its_agent_stopped_or_nobody_saw_end(
    node_a, agent_a, event, reason
):
    booking = make_active_booking([node_a[0].gpus.first()], command="train", start=None)
    code = -15 if event[2] else None  # killed by the agent's SIGTERM; unknown to an old agent
    assert agent_a.events(_interrupted(booking, *event, code=code)).status_code == 202
    booking.refresh_from_db()
    assert (booking.state, booking.restart_count, booking.exit_code) == ("pending", 1, None)
    assert booking.state_detail == f"{reason}; requeued"
    assert not booking.allocations.filter(live=True).exists()


@pytest.mark.parametrize(("event", "reason"), INTERRUPTED)
def test_it_fails_an_interrupted_job_that_cannot_go_back_to_the_queue(
    node_a, agent_a, event, reason
):
    # A fixed window (start and end given) is not requeued; nor is a batch job out of time.
    now = timezone.now()
    window = make_active_booking(
        [node_a[0].gpus.first()], command="train", start=now, end=now + timedelta(hours=1)
    )
    late = make_active_booking([node_a[0].gpus.last()], command="train", start=None)
    late.allocations.update(end=timezone.now() - timedelta(seconds=1))
    for booking in (window, late):
        assert agent_a.events(_interrupted(booking, *event)).status_code == 202
        booking.refresh_from_db()
        assert (booking.state, booking.state_detail) == ("failed", reason)
        assert booking.restart_count == 0


def test_it_refuses_an_interruption_it_does_not_know(node_a, agent_a):
    booking = make_active_booking([node_a[0].gpus.first()], command="x", start=None)
    response = agent_a.events(_interrupted(booking, "exited", "exited", "vanished"))
    assert response.status_code == 400
    assert response.json()["error"]["fields"] == {
        "events[0].interrupted": "must be one of agent_stopped, unwatched"
    }
    booking.refresh_from_db()
    assert booking.state == "active"


def test_it_lists_alerts_in_the_admin(node_a, client):
    NodeAlert.objects.create(
        node=node_a[0], kind="unbooked_process", time=timezone.now(), pid=99, user="eve"
    )
    admin = UserFactory(username="root", is_staff=True, is_superuser=True)
    client.force_login(admin)
    response = client.get("/admin/portal/nodealert/")
    assert response.status_code == 200
    assert b"eve" in response.content


def test_it_ignores_the_exit_of_a_leftover_job_when_the_booking_runs_elsewhere_now(
    node_a, node_b, agent_a
):
    booking = make_active_booking([node_a[0].gpus.first()], command="x")
    # Node A went down, the booking was requeued and now runs on node B.
    booking.allocations.update(live=False)
    make_active_booking([node_b[0].gpus.get()]).allocations.update(booking=booking)
    assert agent_a.events(_exited(booking, 1)).status_code == 202
    booking.refresh_from_db()
    assert (booking.state, booking.exit_code) == ("active", None)


def test_it_ignores_the_old_runs_exit_while_a_requeued_booking_waits(node_a, agent_a):
    from portal.services.booking.bookings import booking_stop

    booking = make_active_booking([node_a[0].gpus.first()], command="x")
    event = booking_stop(
        booking_id=booking.pk, to="preempted", now=timezone.now(), detail="preempted for 9"
    )
    assert event == "requeued"
    assert agent_a.events(_exited(booking, 137, tail="Killed\n")).status_code == 202
    booking.refresh_from_db()
    assert (booking.state, booking.exit_code, booking.log_tail) == ("pending", None, "")


def test_it_names_models_as_users_type_them():
    from portal.services.fleet.nodes import gpu_model_name

    assert gpu_model_name("NVIDIA H100 80GB HBM3") == "H100 80GB HBM3"
    assert gpu_model_name("NVIDIA H200") == "H200"
    assert gpu_model_name("Tesla V100-SXM2-32GB") == "Tesla V100-SXM2-32GB"


def test_it_bounds_agent_strings_by_the_columns_that_store_them():
    assert protocol.UUID_MAX == Gpu._meta.get_field("uuid").max_length
    assert protocol.UUID_MAX == MigInstance._meta.get_field("uuid").max_length
    assert protocol.MODEL_MAX == Gpu._meta.get_field("model").max_length
    assert protocol.PROFILE_MAX == MigInstance._meta.get_field("profile").max_length
    assert protocol.HOSTNAME_MAX == Node._meta.get_field("hostname").max_length
    assert protocol.VERSION_MAX == Node._meta.get_field("agent_version").max_length
    assert protocol.USER_MAX == NodeAlert._meta.get_field("user").max_length


@pytest.mark.django_db
def test_it_words_alerts_in_the_notifications_module(node_a, django_capture_on_commit_callbacks):
    from portal.services.notify.notifications import alert_notify
    from tests.factories import UserFactory

    owner = UserFactory(username="dora", email="dora@example.org")
    alert = NodeAlert.objects.create(
        node=node_a[0], kind="foreign_process", time=timezone.now(), pid=42, user="eve",
        detail="eve runs pid 42 on a device booked by dora", owner=owner,
    )  # fmt: skip
    with django_capture_on_commit_callbacks(execute=True):
        assert alert_notify(alert_id=alert.pk) is True
    (sent,) = mail.outbox
    assert sent.subject == f"GPU alert on {node_a[0]}: {alert.get_kind_display()}"
    assert "Action taken by the agent: report" in sent.body
    assert alert_notify(alert_id=alert.pk + 1000) is False
