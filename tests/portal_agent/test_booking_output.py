"""A running batch job's output: the agent's output events stored on the booking and sent live."""

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from portal.models import Booking, Gpu, Node
from tests.agent_cycles import cycle_until
from tests.channel_listen import listen_as_owner
from tests.factories import UserFactory, make_active_booking

pytestmark = pytest.mark.django_db(transaction=True)


def _output(booking, tail):
    return {
        "kind": "output",
        "time": timezone.now().isoformat(),
        "booking_id": booking.pk,
        "log_tail": tail,
    }


def test_it_stores_a_running_jobs_output_and_sends_it_to_the_owner(node_a, agent_a, settings):
    settings.BOOKING_OUTPUT_MIN_INTERVAL_S = 0
    booking = make_active_booking([node_a[0].gpus.first()], command="python train.py")
    receive = listen_as_owner(booking.owner_id)
    assert agent_a.events(_output(booking, "epoch 1\n")).status_code == 202
    assert Booking.objects.get(pk=booking.pk).log_tail == "epoch 1\n"
    assert receive() == {
        "type": "booking.output",
        "booking_id": booking.pk,
        "log_tail": "epoch 1\n",
    }
    agent_a.events(_output(booking, "epoch 1\nepoch 2\n"))
    booking.refresh_from_db()
    assert booking.state == "active" and booking.log_tail == "epoch 1\nepoch 2\n"
    client = APIClient()
    client.force_authenticate(booking.owner)
    assert client.get(f"/api/v1/bookings/{booking.pk}/").json()["log_tail"] == "epoch 1\nepoch 2\n"


def test_it_writes_a_bookings_output_at_most_once_per_interval(node_a, agent_a, settings):
    settings.BOOKING_OUTPUT_MIN_INTERVAL_S = 60
    booking = make_active_booking([node_a[0].gpus.first()], command="python train.py")
    receive = listen_as_owner(booking.owner_id)
    agent_a.events(_output(booking, "one\n"))
    agent_a.events(_output(booking, "one\ntwo\n"))
    assert Booking.objects.get(pk=booking.pk).log_tail == "one\n"
    assert receive()["log_tail"] == "one\n"
    assert receive(timeout=0.5) is None


def test_it_ignores_output_from_a_node_the_booking_no_longer_runs_on(node_a, agent_a, settings):
    settings.BOOKING_OUTPUT_MIN_INTERVAL_S = 0
    booking = make_active_booking([node_a[0].gpus.first()], command="python train.py")
    booking.allocations.update(live=False)  # requeued away from node-a
    assert agent_a.events(_output(booking, "stale\n")).status_code == 202
    assert Booking.objects.get(pk=booking.pk).log_tail == ""


def test_it_shows_a_real_jobs_output_while_it_runs(real_agents, tmp_path, settings):
    settings.BOOKING_OUTPUT_MIN_INTERVAL_S = 0
    agent = real_agents("sim-output", "1xH100-80GB")
    cycle_until(agent, lambda: Gpu.objects.filter(node__hostname="sim-output").exists())
    gpu = Gpu.objects.get(node=Node.objects.get(hostname="sim-output"))
    go = tmp_path / "go"
    command = f"echo loading data; while [ ! -e {go} ]; do sleep 0.05; done; echo epoch 1 done"
    alice = UserFactory(username="alice")
    booking = make_active_booking([gpu], owner=alice, command=command)
    cycle_until(agent, lambda: Booking.objects.get(pk=booking.pk).log_tail == "loading data\n")
    assert Booking.objects.get(pk=booking.pk).state == "active"
    go.touch()
    cycle_until(agent, lambda: Booking.objects.get(pk=booking.pk).state == "finished")
    assert Booking.objects.get(pk=booking.pk).log_tail == "loading data\nepoch 1 done\n"
