"""A reservation holds no cluster lock: placed with nothing locked, written under its quota
subjects' advisory locks and a share lock on its own nodes, the exclusion constraint deciding
between two bookings that chose the same device."""

import threading
from contextlib import contextmanager
from datetime import timedelta

import pytest
from django.db import IntegrityError, connection, transaction
from django.utils import timezone

from portal.errors import Busy, NoCapacity
from portal.models import Allocation, Booking, Node, NodeHeartbeat
from portal.services.booking import bookings as services
from portal.services.core.locking import (
    is_allocation_clash,
    lock_quota_subjects,
    share_lock_nodes,
)
from scheduler.reserve import Slot
from tests.factories import (
    AllocationFactory,
    ProjectFactory,
    QuotaFactory,
    UserFactory,
    make_node,
    member,
)


def _owner():
    user, project = UserFactory(), ProjectFactory(slug="locks")
    member(user, project)
    QuotaFactory(project=project)
    return user


def _window(hours: int = 1):
    start = timezone.now() + timedelta(hours=hours)
    return {"project": "locks", "gpus": 1, "start": start, "end": start + timedelta(hours=1)}


@pytest.mark.django_db
def test_it_places_again_when_another_booking_took_the_chosen_device(monkeypatch):
    node = make_node("n1", gpus=2)
    first, second = node.gpus.order_by("index")
    user, window = _owner(), _window()
    AllocationFactory(gpu=first, start=window["start"], end=window["end"])
    place = services._place
    calls = []

    def stale_then_real(request, image):
        calls.append(1)
        if len(calls) == 1:  # placed before the other booking's insert committed
            return [Slot(node.pk, first.pk, None, first.model)]
        return place(request, image)

    monkeypatch.setattr(services, "_place", stale_then_real)
    booking = services.booking_submit(user=user, now=timezone.now(), **window)
    assert len(calls) == 2
    assert list(booking.allocations.values_list("gpu_id", flat=True)) == [second.pk]
    assert Booking.objects.filter(owner=user).count() == 1


@pytest.mark.django_db
def test_it_refuses_after_a_few_placements_all_taken_meanwhile(monkeypatch):
    node = make_node("n1", gpus=1)
    gpu = node.gpus.get()
    user, window = _owner(), _window()
    AllocationFactory(gpu=gpu, start=window["start"], end=window["end"])
    calls = []

    def always_stale(request, image):
        calls.append(1)
        return [Slot(node.pk, gpu.pk, None, gpu.model)]

    monkeypatch.setattr(services, "_place", always_stale)
    with pytest.raises(NoCapacity):
        services.booking_submit(user=user, now=timezone.now(), **window)
    assert len(calls) == services.RESERVE_ATTEMPTS
    assert not Booking.objects.filter(owner=user).exists()


@pytest.mark.django_db
@pytest.mark.both_databases
def test_it_places_again_when_the_chosen_node_went_down_meanwhile(monkeypatch):
    down, up = make_node("a-down", gpus=1), make_node("b-up", gpus=1)
    user, window = _owner(), _window()
    place = services._place

    def on_the_down_node_first(request, image):
        devices = place(request, image)
        if Node.objects.get(pk=down.pk).state == Node.State.UP:
            Node.objects.filter(pk=down.pk).update(state=Node.State.DOWN)
            gpu = down.gpus.get()
            return [Slot(down.pk, gpu.pk, None, gpu.model)]
        return devices

    monkeypatch.setattr(services, "_place", on_the_down_node_first)
    booking = services.booking_submit(user=user, now=timezone.now(), **window)
    assert list(booking.allocations.values_list("gpu__node_id", flat=True)) == [up.pk]


@pytest.mark.django_db
def test_it_counts_only_the_no_overlap_constraint_as_a_clash():
    gpu = make_node("n1", gpus=1).gpus.get()
    start = timezone.now()
    AllocationFactory(gpu=gpu, start=start, end=start + timedelta(hours=2))
    with pytest.raises(IntegrityError) as overlap, transaction.atomic():
        AllocationFactory(gpu=gpu, start=start, end=start + timedelta(hours=1))
    with pytest.raises(IntegrityError) as unique, transaction.atomic():
        make_node("n1", gpus=0)  # the hostname's unique constraint
    assert is_allocation_clash(overlap.value)
    assert not is_allocation_clash(unique.value)


@contextmanager
def _held_elsewhere(take):
    """Hold what ``take()`` locks in another connection's transaction while inside the block."""
    inside, done = threading.Event(), threading.Event()

    def hold():
        try:
            with transaction.atomic():
                take()
                inside.set()
                done.wait(20)
        finally:
            connection.close()

    other = threading.Thread(target=hold)
    other.start()
    try:
        assert inside.wait(10)
        yield
    finally:
        done.set()
        other.join(10)


@pytest.mark.django_db(transaction=True)
def test_it_does_not_wait_for_nodes_it_was_not_placed_on(settings):
    # A node locked by another writer (a start, a state change) no longer holds up a
    # reservation that goes elsewhere: before, every candidate node was locked.
    settings.BOOKING_LOCK_TIMEOUT_MS = 2000
    full, free = make_node("a-full", gpus=1), make_node("b-free", gpus=1)
    user, window = _owner(), _window()
    AllocationFactory(gpu=full.gpus.get(), start=window["start"], end=window["end"])
    with _held_elsewhere(lambda: list(Node.objects.select_for_update().filter(pk=full.pk))):
        # Waiting for that lock would end in Busy (503) after the lock timeout.
        booking = services.booking_submit(user=user, now=timezone.now(), **window)
    assert list(booking.allocations.values_list("gpu__node_id", flat=True)) == [free.pk]


@pytest.mark.django_db(transaction=True)
def test_it_keeps_two_reservations_on_one_node_from_waiting_on_each_other(settings):
    # Share locks: two bookings placed on the same node both hold its row at once.
    settings.BOOKING_LOCK_TIMEOUT_MS = 2000
    node = make_node("n1", gpus=2)
    user, window = _owner(), _window()
    with _held_elsewhere(lambda: share_lock_nodes([node.pk])):
        services.booking_submit(user=user, now=timezone.now(), **window)  # not Busy
    assert Allocation.objects.filter(live=True).count() == 1


@pytest.mark.django_db(transaction=True)
def test_it_answers_busy_when_the_quota_lock_is_not_granted_in_time(settings):
    settings.BOOKING_LOCK_TIMEOUT_MS = 300
    make_node("n1", gpus=1)
    user, window = _owner(), _window()
    project_id = user.memberships.get().project_id
    # Another reservation of the project, between its quota check and its commit.
    with _held_elsewhere(lambda: lock_quota_subjects(project_id=project_id)):
        with pytest.raises(Busy):
            services.booking_submit(user=user, now=timezone.now(), **window)
    assert not Booking.objects.filter(owner=user).exists()


@pytest.mark.django_db(transaction=True)
def test_it_keeps_heartbeats_from_waiting_behind_a_booking_on_the_node(settings):
    from portal.services.fleet.nodes import node_mark_seen

    settings.BOOKING_LOCK_TIMEOUT_MS = 2000
    node = make_node("n1", gpus=1)
    NodeHeartbeat.objects.filter(node=node).update(last_seen=timezone.now() - timedelta(minutes=1))
    # A reservation on the node, between its share lock and its commit.
    with _held_elsewhere(lambda: share_lock_nodes([node.pk])):
        with connection.cursor() as cursor:  # would wait (then fail) on the node row
            cursor.execute("SET lock_timeout = '500ms'")
        try:
            node_mark_seen(node=Node.objects.get(pk=node.pk))
        finally:
            with connection.cursor() as cursor:
                cursor.execute("SET lock_timeout = 0")
    seen = NodeHeartbeat.objects.get(node=node).last_seen
    assert timezone.now() - seen < timedelta(seconds=30)
