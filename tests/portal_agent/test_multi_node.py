"""A booking across two nodes, for real: two agents (simulated GPUs) against the live portal.

Each node runs its own process with its rank; the processes meet over a socket at rank 0's
MASTER_ADDR:MASTER_PORT (docs/examples/rendezvous.py) and the booking finishes when both have.
The gang rule: one failing node fails the booking, naming it, and the other node is stopped.
"""

import sys
import time
from datetime import timedelta
from pathlib import Path

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from portal.models import Booking, Gpu, NodeRun
from portal.services.booking.bookings import booking_stop
from portal.services.fleet.runs import agent_desired_dispatch
from tests.factories import AllocationFactory, UserFactory, make_active_booking

pytestmark = pytest.mark.django_db(transaction=True)

RENDEZVOUS = Path(__file__).resolve().parents[2] / "docs" / "examples" / "rendezvous.py"
HOSTS = ("sim-mn-a", "sim-mn-b")


@pytest.fixture
def two_nodes(real_agents):
    agents = [real_agents(hostname, "2xH100-80GB") for hostname in HOSTS]
    _cycle(agents, lambda: Gpu.objects.filter(node__hostname__in=HOSTS).count() == 4)
    return agents


def _cycle(agents, condition, timeout_s=30.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for agent in agents:
            agent.handle_one_cycle()
        if condition():
            return
        time.sleep(0.05)
    raise AssertionError(f"condition not met within {timeout_s} s")


def _gpus():
    return list(Gpu.objects.filter(node__hostname__in=HOSTS).order_by("node__hostname", "index"))


def _state(booking):
    return Booking.objects.get(pk=booking.pk).state


def test_it_runs_a_rendezvous_across_two_nodes_and_finishes_when_both_ranks_do(
    two_nodes, allocation_passes
):
    alice = UserFactory(username="alice")
    booking = make_active_booking(
        _gpus(), owner=alice, gpus=4, command=f"{sys.executable} {RENDEZVOUS}"
    )
    _cycle(two_nodes, lambda: _state(booking) != "active")
    booking.refresh_from_db()
    assert (booking.state, booking.state_detail) == ("finished", "all 2 nodes exited with code 0")
    assert booking.exit_code == 0
    assert booking.log_tail == "rank 0 of 2 nodes (4 GPUs) met ranks 0,1\n"
    runs = NodeRun.objects.filter(booking=booking).order_by("rank")
    assert [(r.node.hostname, r.rank, r.state, r.exit_code) for r in runs] == [
        ("sim-mn-a", 0, "exited", 0),
        ("sim-mn-b", 1, "exited", 0),
    ]
    assert runs[1].log_tail == "rank 1 of 2 nodes (4 GPUs) met ranks 0,1\n"

    api = APIClient()
    api.force_authenticate(alice)
    body = api.get(f"/api/v1/bookings/{booking.pk}/").json()
    assert [(n["node"], n["rank"], n["exit_code"]) for n in body["nodes"]] == [
        ("sim-mn-a", 0, 0),
        ("sim-mn-b", 1, 0),
    ]
    (listed,) = [b for b in api.get("/api/v1/bookings/").json()["results"] if b["id"] == booking.pk]
    assert listed["nodes"] == body["nodes"]


def test_it_fails_the_booking_naming_the_node_that_failed_and_stops_the_other(
    two_nodes, allocation_passes
):
    alice = UserFactory(username="alice")
    command = 'if [ "$NODE_RANK" = 1 ]; then echo broken; exit 3; fi; sleep 60'
    booking = make_active_booking(_gpus(), owner=alice, gpus=4, command=command)
    _cycle(two_nodes, lambda: _state(booking) != "active")
    booking.refresh_from_db()
    assert booking.state == "failed"
    assert booking.state_detail == (
        "node sim-mn-b (rank 1) exited with code 3; the other nodes were stopped"
    )
    assert (booking.exit_code, booking.log_tail) == (3, "broken\n")
    # Rank 0 is stopped (no longer desired) and says so on its own run.
    _cycle(two_nodes, lambda: NodeRun.objects.filter(booking=booking, state="stopped").exists())
    stopped = NodeRun.objects.get(booking=booking, rank=0)
    assert stopped.node.hostname == "sim-mn-a" and stopped.detail.startswith("stopped:")
    assert Booking.objects.get(pk=booking.pk).exit_code == 3  # the late stop changes nothing


def test_it_hands_each_multi_node_booking_its_own_port_once(two_nodes):
    gpus = _gpus()
    first = make_active_booking([gpus[0], gpus[2]], gpus=2, command="sleep 60")
    second = make_active_booking([gpus[1], gpus[3]], gpus=2, command="sleep 60")
    node_id = gpus[0].node_id
    desired = {b.booking_id: b for b in agent_desired_dispatch(node_id=node_id).bookings}
    ports = {desired[first.pk].master_port, desired[second.pk].master_port}
    assert ports == {29500, 29501}
    # Asked again (the other node's pull, a push), the ports stay.
    other = agent_desired_dispatch(node_id=gpus[2].node_id).bookings
    assert {b.booking_id: b.master_port for b in other} == {
        first.pk: desired[first.pk].master_port,
        second.pk: desired[second.pk].master_port,
    }
    assert [b.node_rank for b in other] == [1, 1]
    assert [p.hostname for p in desired[first.pk].nodes] == list(HOSTS)
    # MASTER_ADDR is what each agent registered with (--address), not its hostname.
    assert [p.address for p in desired[first.pk].nodes] == ["127.0.0.1", "127.0.0.1"]


def test_it_relaunches_a_requeued_booking_as_a_restart(two_nodes, allocation_passes, tmp_path):
    alice = UserFactory(username="alice")
    gpu = _gpus()[0]
    booking = make_active_booking([gpu], owner=alice, command="sleep 60")
    assert booking_stop(booking_id=booking.pk, to="preempted", now=timezone.now(), detail="test")
    booking.refresh_from_db()
    assert (booking.state, booking.restart_count) == ("pending", 1)
    # Started again (as the allocation pass would): the job hears it is a restart.
    seen = tmp_path / "restart"
    Booking.objects.filter(pk=booking.pk).update(
        state="active", command=f'echo "$GPU_PORTAL_RESTART_COUNT" > {seen}'
    )
    now = timezone.now()
    AllocationFactory(
        booking=booking, gpu=gpu, start=now, end=now + timedelta(hours=1), fraction=1.0
    )
    _cycle(two_nodes, lambda: seen.exists() and seen.read_text().strip() != "")
    assert seen.read_text() == "1\n"
