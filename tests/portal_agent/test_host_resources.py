"""A node's CPU cores and host memory: what its agent reports at register, what the nodes API
shows, and a job its memory limit killed, on its booking and in its owner's mail."""

from datetime import timedelta

import pytest
from django.core import mail
from django.utils import timezone

from agents import protocol
from portal.models import Booking, Node
from tests.conftest import error_of
from tests.factories import make_active_booking
from tests.portal_agent.test_agent_api import REGISTER

pytestmark = pytest.mark.django_db


def test_it_keeps_the_cores_and_memory_the_agent_reports_and_the_api_shows_them(
    node_a, agent_a, admin_client
):
    body = {
        **REGISTER,
        "cpus": 111,
        "memory_mib": 2 * 1024 * 1024 - 4096,
        "numa_cpus": [
            {"numa_node": 0, "cpu_list": "1-55"},
            {"numa_node": 1, "cpu_list": "56-111"},
        ],
    }
    assert agent_a.post(protocol.REGISTER_PATH, body).status_code == 200
    node = Node.objects.get(pk=node_a[0].pk)
    assert (node.cpus, node.memory_mib) == (111, 2 * 1024 * 1024 - 4096)
    shown = admin_client.get("/api/v1/nodes/").json()["results"]
    assert [(n["hostname"], n["cpus"], n["memory_mib"]) for n in shown] == [
        ("node-a", 111, 2 * 1024 * 1024 - 4096)
    ]
    # An older agent reports none: unknown again, never the last agent's numbers.
    assert agent_a.post(protocol.REGISTER_PATH, REGISTER).status_code == 200
    node.refresh_from_db()
    assert (node.cpus, node.memory_mib) == (None, None)


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"cpus": 0}, "cpus"),
        ({"cpus": protocol.CPUS_MAX + 1}, "cpus"),
        ({"cpus": "64"}, "cpus"),
        ({"memory_mib": 0}, "memory_mib"),
        ({"memory_mib": 2**31}, "memory_mib"),
        ({"numa_cpus": [{"numa_node": 0, "cpu_list": "0" * 5000}]}, "numa_cpus[0].cpu_list"),
        ({"numa_cpus": [{"numa_node": 5000, "cpu_list": "0"}]}, "numa_cpus[0].numa_node"),
    ],
)
def test_it_refuses_bad_host_resources_naming_the_field(node_a, agent_a, change, field):
    response = agent_a.post(protocol.REGISTER_PATH, {**REGISTER, **change})
    assert response.status_code == 400, response.content
    assert field in error_of(response)["fields"], error_of(response)
    assert Node.objects.get(pk=node_a[0].pk).cpus is None


def test_it_fails_a_job_its_memory_limit_killed_with_that_reason_and_mails_it(
    node_a, agent_a, django_capture_on_commit_callbacks
):
    booking = make_active_booking([node_a[0].gpus.first()], command="python train.py")
    booking.owner.email = "owner@example.org"
    booking.owner.save()
    event = {
        "kind": "exited",
        "time": timezone.now().isoformat(),
        "detail": protocol.oom_reason(64 * 1024),
        "booking_id": booking.pk,
        "exit_code": -9,
        "log_tail": "allocating\n",
        "oom_limit_mib": 64 * 1024,
    }
    with django_capture_on_commit_callbacks(execute=True):
        assert agent_a.events(event).status_code == 202
    booking.refresh_from_db()
    assert booking.state == Booking.State.FAILED
    reason = "command was killed by its memory limit of 64 GiB (out of memory); exit code -9"
    assert booking.state_detail == reason
    assert booking.exit_code == -9
    (sent,) = [m for m in mail.outbox if m.to == ["owner@example.org"]]
    assert "killed by its memory limit of 64 GiB" in sent.subject + sent.body


def test_it_still_says_exit_code_for_a_job_that_no_limit_killed(node_a, agent_a):
    booking = make_active_booking([node_a[0].gpus.first()], command="python train.py")
    event = {
        "kind": "exited",
        "time": timezone.now().isoformat(),
        "detail": "exited",
        "booking_id": booking.pk,
        "exit_code": -9,
    }
    assert agent_a.events(event).status_code == 202
    booking.refresh_from_db()
    assert booking.state_detail == "command exited with code -9"


def test_it_seeds_the_demo_nodes_with_the_cores_and_memory_their_agents_report(
    settings, tmp_path, admin_client
):
    from agents.host import reserve
    from agents.simulate import SimulatedBackend
    from portal.services.reporting.demo import DEMO_NODES, demo_nodes_seed

    settings.VAR_DIR = tmp_path / "var"
    demo_nodes_seed()
    shown = {
        n["hostname"]: (n["cpus"], n["memory_mib"])
        for n in admin_client.get("/api/v1/nodes/").json()["results"]
    }
    assert shown == {
        "gpu-a01": (112, 2 * 1024 * 1024),  # 8 H100: a DGX H100's 2 x 56 cores and 2 TiB
        "gpu-a02": (128, 1024 * 1024),
        "gpu-a03": (128, 1024 * 1024),
    }
    for hostname, spec in DEMO_NODES.items():  # what `up`'s agents will say at register
        usable = reserve(SimulatedBackend(spec, hostname).host())
        assert (len(usable.cpus), usable.memory_mib) == shown[hostname]


def test_it_names_the_node_whose_memory_limit_killed_a_multi_node_job(node_a, node_b):
    from tests.portal_agent.conftest import AgentClient

    booking = make_active_booking(
        [node_a[0].gpus.first(), node_b[0].gpus.first()], command="torchrun train.py", gpus=2
    )
    event = {
        "kind": "exited",
        "time": timezone.now().isoformat(),
        "detail": protocol.oom_reason(512),
        "booking_id": booking.pk,
        "exit_code": -9,
        "oom_limit_mib": 512,
    }
    assert AgentClient(node_b[1]).events(event).status_code == 202
    booking.refresh_from_db()
    assert booking.state == Booking.State.FAILED
    assert booking.state_detail == (
        "node node-b (rank 1) was killed by its memory limit of 512 MiB (out of memory); "
        "the other nodes were stopped"
    )


def test_it_shows_the_cores_and_memory_read_only_in_the_admin(node_a, admin_client):
    Node.objects.filter(pk=node_a[0].pk).update(cpus=112, memory_mib=2097152)
    page = admin_client.get(f"/admin/portal/node/{node_a[0].pk}/change/").content.decode()
    assert 'name="cpus"' not in page and 'name="memory_mib"' not in page  # not a form field
    assert '<div class="readonly">112</div>' in page
    listing = admin_client.get("/admin/portal/node/").content.decode()
    assert "2097152" in listing


@pytest.mark.both_databases
def test_it_stops_the_newest_running_bookings_when_a_smaller_node_registers(
    node_a, agent_a, allocation_passes
):
    big = {**REGISTER, "cpus": 64, "memory_mib": 512 * 1024}
    assert agent_a.post(protocol.REGISTER_PATH, big).status_code == 200
    node = Node.objects.get(pk=node_a[0].pk)
    whole = list(node.gpus.filter(retired_at__isnull=True, mig_mode=False))
    migs = [m for g in node.gpus.filter(mig_mode=True) for m in g.mig_instances.all()]
    devices = (whole + migs)[:3]
    older, middle, newest = (
        make_active_booking([device], cpus=20, memory_mib=1024) for device in devices
    )
    Booking.objects.filter(pk=older.pk).update(started_at=timezone.now() - timedelta(hours=2))
    Booking.objects.filter(pk=middle.pk).update(started_at=timezone.now() - timedelta(hours=1))
    # The replacement has 45 cores: two of the three 20-core bookings fit.
    smaller = {**REGISTER, "cpus": 45, "memory_mib": 512 * 1024}
    assert agent_a.post(protocol.REGISTER_PATH, smaller).status_code == 200
    states = dict(Booking.objects.values_list("pk", "state"))
    assert states[older.pk] == states[middle.pk] == Booking.State.ACTIVE
    assert states[newest.pk] != Booking.State.ACTIVE
    detail = Booking.objects.get(pk=newest.pk).state_detail
    assert "node-a now has 45 cores" in detail, detail
