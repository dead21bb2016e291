"""The portal's side of a job its agent stopped for keeping more GPU memory than its share of a
shared GPU: the booking fails with the agent's reason, its owner is told, its neighbour runs on."""

import pytest
from django.core import mail
from django.utils import timezone

from portal.models import Booking
from tests.factories import UserFactory, make_shared_booking

REASON = "used 31 GiB of GPU memory, over its 20 GiB share, for 30 s"


def _tenant(gpu, owner):
    """An active batch booking of half of `gpu` with a 20 GiB memory share."""
    return make_shared_booking(
        gpu, share=0.5, memory_mib=20480, owner=owner, command="python train.py"
    )


@pytest.fixture
def shared_gpu(node_a):
    return node_a[0].gpus.order_by("index").first()


def _exceeded(booking, gpu, detail=REASON):
    return {
        "kind": "memory_exceeded",
        "time": timezone.now().isoformat(),
        "detail": detail,
        "booking_id": booking.pk,
        "device_uuid": gpu.uuid,
        "action": "kill",
    }


@pytest.mark.both_databases
def test_it_fails_the_tenant_over_its_share_with_the_reason_and_tells_its_owner(
    node_a, agent_a, shared_gpu, django_capture_on_commit_callbacks
):
    owner = UserFactory(username="erin", email="erin@example.org")
    over = _tenant(shared_gpu, owner)
    neighbour = _tenant(shared_gpu, UserFactory(username="finn", email="finn@example.org"))

    with django_capture_on_commit_callbacks(execute=True):
        assert agent_a.events(_exceeded(over, shared_gpu)).status_code == 202

    over.refresh_from_db()
    reason = f"stopped by the agent: it {REASON} (node node-a)"
    assert (over.state, over.state_detail) == ("failed", reason)
    assert over.restart_count == 0  # never requeued: it would do the same again
    assert not over.allocations.filter(live=True).exists()
    assert Booking.objects.get(pk=neighbour.pk).state == "active"
    assert neighbour.allocations.filter(live=True).count() == 1
    (sent,) = mail.outbox
    assert sent.to == ["erin@example.org"]
    assert sent.subject == f"Booking {over.pk} failed: {reason}"


def test_the_stop_that_follows_brings_the_jobs_output_and_changes_nothing_else(
    node_a, agent_a, shared_gpu
):
    over = _tenant(shared_gpu, UserFactory())
    assert agent_a.events(_exceeded(over, shared_gpu)).status_code == 202
    tail = f"epoch 3\ngpu-portal: stopping the job: it {REASON}\n"
    stopped = {
        "kind": "stopped",
        "time": timezone.now().isoformat(),
        "detail": f"stopped: {REASON}",
        "booking_id": over.pk,
        "exit_code": -15,
        "log_tail": tail,
    }
    assert agent_a.events(stopped).status_code == 202
    over.refresh_from_db()
    assert (over.state, over.log_tail, over.exit_code) == ("failed", tail, -15)
    assert over.state_detail.startswith("stopped by the agent: it used 31 GiB")


def test_it_ignores_a_late_report_for_a_booking_that_ended_already(node_a, agent_a, shared_gpu):
    over = _tenant(shared_gpu, UserFactory())
    Booking.objects.filter(pk=over.pk).update(state=Booking.State.CANCELLED)
    assert agent_a.events(_exceeded(over, shared_gpu)).status_code == 202
    assert Booking.objects.get(pk=over.pk).state == "cancelled"


def test_it_refuses_a_report_without_a_booking(node_a, agent_a, shared_gpu):
    event = {**_exceeded(_tenant(shared_gpu, UserFactory()), shared_gpu), "booking_id": None}
    response = agent_a.events(event)
    assert response.status_code == 400
    assert response.json()["error"]["fields"] == {
        "events[0].booking_id": "is required for memory_exceeded"
    }
