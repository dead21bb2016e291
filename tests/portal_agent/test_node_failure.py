"""A node whose agent falls silent goes down; its bookings fail or go back to the queue."""

from datetime import timedelta

import pytest
from django.core import mail
from django.utils import timezone

from portal import tasks
from portal.models import Booking, Node
from portal.services.nodes import node_mark_seen, nodes_heartbeat_check
from tests.factories import UserFactory, make_active_booking, make_node

pytestmark = pytest.mark.django_db(transaction=True)


def _silent(node, seconds):
    Node.objects.filter(pk=node.pk).update(last_seen=timezone.now() - timedelta(seconds=seconds))


def test_it_marks_a_silent_node_down_and_fails_or_requeues_its_bookings(
    settings, allocation_passes
):
    settings.NODE_HEARTBEAT_TIMEOUT_S = 60
    dead, alive = make_node("node-dead", gpus=2), make_node("node-alive", gpus=1)
    owner = UserFactory(username="dora", email="dora@example.org")
    gpus = list(dead.gpus.order_by("index"))
    interactive = make_active_booking([gpus[0]], owner=owner)
    batch = make_active_booking([gpus[1]], owner=owner, command="python train.py")
    elsewhere = make_active_booking([alive.gpus.get()], owner=owner)
    submitted = batch.submitted_at
    _silent(dead, 120)
    _silent(alive, 10)

    tasks.node_heartbeat_check()

    dead.refresh_from_db()
    assert dead.state == "down" and dead.state_reason.startswith("no heartbeat since")
    assert Node.objects.get(pk=alive.pk).state == "up"
    interactive.refresh_from_db()
    assert interactive.state == "failed"
    assert interactive.state_detail == "node node-dead stopped reporting"
    assert not interactive.allocations.filter(live=True).exists()
    batch.refresh_from_db()
    assert batch.state == "pending" and batch.submitted_at == submitted
    assert batch.state_detail == "node node-dead stopped reporting; requeued"
    assert not batch.allocations.filter(live=True).exists()
    assert Booking.objects.get(pk=elsewhere.pk).state == "active"
    subjects = sorted(m.subject for m in mail.outbox)
    assert subjects == [
        f"Booking {interactive.pk} failed: node node-dead stopped reporting",
        f"Booking {batch.pk} was preempted and requeued",
    ]
    assert allocation_passes  # the queue may move now
    assert nodes_heartbeat_check(now=timezone.now()) == []  # already down: nothing twice


def test_it_fails_batch_bookings_too_when_requeue_is_off(settings, allocation_passes):
    settings.REQUEUE_ON_NODE_FAILURE = False
    node = make_node("node-x", gpus=1)
    batch = make_active_booking([node.gpus.get()], command="x")
    _silent(node, 600)
    assert nodes_heartbeat_check(now=timezone.now()) == ["node-x"]
    batch.refresh_from_db()
    assert batch.state == "failed"


def test_it_brings_a_down_node_back_when_it_reports(allocation_passes):
    node = make_node("node-y", gpus=1, state=Node.State.DOWN)
    assert node_mark_seen(node=node) is True
    assert Node.objects.get(pk=node.pk).state == "up"
    assert node_mark_seen(node=node) is False
    assert allocation_passes == [1]  # its GPUs are free again


def test_it_leaves_drained_and_fresh_nodes_alone(settings):
    drained = make_node("node-d", gpus=1, state=Node.State.DRAIN)
    fresh = make_node("node-f", gpus=1)
    _silent(drained, 600)
    _silent(fresh, 5)
    assert nodes_heartbeat_check(now=timezone.now()) == []
