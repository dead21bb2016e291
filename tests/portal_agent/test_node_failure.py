"""A node whose agent falls silent goes down; its bookings fail or go back to the queue."""

import threading
from datetime import timedelta

import psycopg
import pytest
from django.core import mail
from django.db import connection
from django.utils import timezone

from portal import tasks
from portal.models import AuditEvent, Booking, Node
from portal.services.fleet.nodes import node_mark_seen, nodes_heartbeat_check
from portal.services.fleet.selectors import node_for_token
from tests.factories import UserFactory, make_active_booking, make_agent_node, make_node
from tests.workers import wait_until

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
        f"Booking {batch.pk} is back in the queue: node node-dead stopped reporting; requeued",
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


# -- a heartbeat racing the node-down compare-and-set ----------------------------------------


def _admin_connection(autocommit: bool = False) -> psycopg.Connection:
    db = connection.settings_dict
    return psycopg.connect(
        host=db["HOST"], port=db["PORT"], user=db["USER"], dbname=db["NAME"], autocommit=autocommit
    )


def _lock_waiters(admin: psycopg.Connection, like: str) -> int:
    row = admin.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
        "AND wait_event_type = 'Lock' AND query LIKE %s",
        [like],
    ).fetchone()
    return row[0]


def _in_thread(target, results: dict, name: str) -> threading.Thread:
    def run():
        try:
            results[name] = target()
        except BaseException as exc:  # reported by the test, not lost in the thread
            results[name] = exc
        finally:
            connection.close()

    thread = threading.Thread(target=run, name=name)
    thread.start()
    return thread


def _heartbeat(token: str):
    # As the agent API does: authenticate (reads the node), then record the heartbeat.
    return node_mark_seen(node=node_for_token(token))


def _assert_invariant(node_id: int, booking_id: int, cutoff) -> None:
    node = Node.objects.get(pk=node_id)
    booking = Booking.objects.get(pk=booking_id)
    failed = AuditEvent.objects.filter(action="booking.fail", target_id=str(booking_id)).count()
    assert failed <= 1, "a booking failed twice"
    if booking.state == "active":
        assert (node.state, failed) == ("up", 0), "bookings left running on a down node"
    else:
        assert (booking.state, failed) == ("failed", 1)
    # A heartbeat recorded after the scan's cutoff means the node is alive: never left down.
    assert not (node.state == "down" and node.last_seen >= cutoff), (
        f"node down while its heartbeat of {node.last_seen:%H:%M:%S.%f} was recorded"
    )


def test_it_brings_the_node_up_when_a_heartbeat_lands_while_it_is_being_marked_down(
    settings, allocation_passes
):
    settings.NODE_HEARTBEAT_TIMEOUT_S = 60
    node, token = make_agent_node("node-race", gpus=1)
    booking = make_active_booking([node.gpus.get()])
    _silent(node, 120)
    now = timezone.now()
    cutoff = now - timedelta(seconds=60)
    results: dict = {}
    # The test holds the booking row, so the scan stops after its node-down update (its
    # transaction open, the node row locked) at the point where it fails the booking.
    hold = _admin_connection()
    admin = _admin_connection(autocommit=True)
    try:
        hold.execute("SELECT id FROM portal_booking WHERE id = %s FOR UPDATE", [booking.pk])
        down = _in_thread(lambda: nodes_heartbeat_check(now=now), results, "down")
        wait_until(lambda: _lock_waiters(admin, '%UPDATE "portal_booking"%'), 30, "the scan")
        beat = _in_thread(lambda: _heartbeat(token), results, "beat")
        wait_until(lambda: _lock_waiters(admin, '%UPDATE "portal_node"%'), 30, "the heartbeat")
    finally:
        hold.rollback()
        hold.close()
        admin.close()
    down.join(30)
    beat.join(30)
    assert results["down"] == ["node-race"]
    assert not isinstance(results["beat"], BaseException), results["beat"]
    _assert_invariant(node.pk, booking.pk, cutoff)
    assert Node.objects.get(pk=node.pk).state == "up"
    assert _heartbeat(token) is False  # already up again: nothing more to do
    assert Node.objects.get(pk=node.pk).state == "up"


def test_it_keeps_the_node_up_when_the_heartbeat_lands_first(settings, allocation_passes):
    from portal.services.fleet.nodes import _node_down

    settings.NODE_HEARTBEAT_TIMEOUT_S = 60
    node, token = make_agent_node("node-first", gpus=1)
    booking = make_active_booking([node.gpus.get()])
    _silent(node, 120)
    now = timezone.now()
    cutoff = now - timedelta(seconds=60)
    # The scan read the node as stale, then the heartbeat committed before its compare-and-set.
    assert _heartbeat(token) is False
    assert _node_down(node.pk, "node-first", cutoff, now) is False
    _assert_invariant(node.pk, booking.pk, cutoff)
    assert Booking.objects.get(pk=booking.pk).state == "active"


def test_it_holds_the_invariant_for_heartbeats_racing_the_scan_freely(settings, allocation_passes):
    settings.NODE_HEARTBEAT_TIMEOUT_S = 60
    node, token = make_agent_node("node-free", gpus=1)
    for _ in range(8):
        booking = make_active_booking([node.gpus.get()])
        Node.objects.filter(pk=node.pk).update(state=Node.State.UP)
        _silent(node, 120)
        now = timezone.now()
        start = threading.Barrier(2)
        results: dict = {}
        threads = [
            _in_thread(
                lambda s=start, t=now: s.wait() or nodes_heartbeat_check(now=t), results, "down"
            ),
            _in_thread(lambda s=start: s.wait() or _heartbeat(token), results, "beat"),
        ]
        for thread in threads:
            thread.join(30)
        assert not any(isinstance(r, BaseException) for r in results.values()), results
        _assert_invariant(node.pk, booking.pk, now - timedelta(seconds=60))
        _heartbeat(token)  # a heartbeat after the down brings it back up
        assert Node.objects.get(pk=node.pk).state == "up"
        Booking.objects.filter(pk=booking.pk).update(state=Booking.State.FINISHED)
        booking.allocations.update(live=False)
