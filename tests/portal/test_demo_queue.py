"""The demo opens with a queue: bookings running, others waiting for different reasons, and a
reservation later on, so the first page shows planned starts and reasons."""

from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.utils import timezone

from portal.models import Booking, Node
from portal.services.booking.bookings import booking_cancel, booking_submit
from portal.services.reporting.demo import demo_nodes_up, demo_queue_seed
from tests.factories import node_seen

pytestmark = [pytest.mark.django_db, pytest.mark.both_databases]


@pytest.fixture
def demo(settings, tmp_path):
    """The seeded demo with its agents registered (every demo node up)."""
    settings.VAR_DIR = tmp_path / "var"
    call_command("seed_demo", verbosity=0)
    assert not demo_nodes_up()
    Node.objects.update(state=Node.State.UP)
    for node in Node.objects.all():
        node_seen(node, timezone.now())
    assert demo_nodes_up()


def test_it_opens_with_running_waiting_and_reserved_bookings(demo):
    now = timezone.now()
    made = demo_queue_seed()

    bookings = Booking.objects.filter(pk__in=made).select_related("owner")
    running = [b for b in bookings if b.state == Booking.State.ACTIVE]
    waiting = [b for b in bookings if b.state == Booking.State.PENDING]
    planned = [b for b in bookings if b.state == Booking.State.PLANNED]
    assert len(running) == 3 and all(b.command.startswith("sleep ") for b in running)
    assert any(b.mig_profile for b in running)
    assert {b.pending_reason for b in waiting} == {"resources", "quota"}
    assert all(b.queue_position and b.planned_start and b.state_detail for b in waiting)
    (reservation,) = planned
    assert now + timedelta(hours=2) <= reservation.start <= now + timedelta(hours=3)


def test_it_leaves_the_queue_a_restart_finds_and_makes_one_when_it_has_run(demo):
    first = demo_queue_seed()
    assert demo_queue_seed() == []  # the next start of up, while the queue still waits
    assert Booking.objects.count() == len(first)

    # Later all of it has run (here: ended by hand): the next start opens with a queue again.
    for booking in Booking.objects.filter(state__in=["pending", "planned", "active"]):
        booking_cancel(user=booking.owner, booking_id=booking.pk, now=timezone.now())
    again = demo_queue_seed()

    assert len(again) == len(first)
    waiting = Booking.objects.filter(pk__in=again, state="pending")
    assert {b.pending_reason for b in waiting} == {"resources", "quota"}
    assert Booking.objects.filter(pk__in=again, state="planned").count() == 1


def test_it_counts_only_its_own_bookings_as_the_demo_queue(demo):
    alice = get_user_model().objects.get(username="alice")
    visitor = booking_submit(user=alice, now=timezone.now(), gpus=1, duration_s=3600)
    assert visitor.state in ("pending", "active")

    assert len(demo_queue_seed()) == 6
