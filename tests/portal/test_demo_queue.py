"""The demo opens with a queue: bookings running (one of them borrowed past its project's quota),
others waiting, a reservation later on and a weekly project reservation, so the first page
shows planned starts and reasons."""

from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.utils import timezone

from portal.models import Allocation, Booking, Gpu, Node, ProjectReservation
from portal.services.allocation.allocation import allocation_pass
from portal.services.allocation.snapshot import snapshot_take
from portal.services.booking.bookings import booking_cancel, booking_submit
from portal.services.core.clock import to_epoch
from portal.services.reporting.demo import DEMO_RUNNING, demo_nodes_up, demo_queue_seed
from tests.factories import node_seen

pytestmark = [pytest.mark.django_db, pytest.mark.both_databases]


@pytest.fixture
def demo(settings, tmp_path):
    """The seeded demo with its agents registered (every demo node up), and quota borrowing on
    as `up` turns it on for the demo."""
    settings.VAR_DIR = tmp_path / "var"
    settings.QUOTA_BORROWING = True
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
    assert len(running) == 8 and all(b.command.startswith("sleep ") for b in running)
    assert any(b.mig_profile for b in running)
    # carol's A100s would put vision at 12.75 of its 12 GPUs: they start borrowed at once.
    (borrowed,) = [b for b in running if b.borrowed]
    assert (borrowed.owner.username, borrowed.project.slug) == ("carol", "vision")
    assert borrowed.borrowed_past == "project vision" and borrowed.gpus == 4
    assert {b.pending_reason for b in waiting} == {"resources"}
    assert all(b.queue_position and b.planned_start and b.state_detail for b in waiting)
    (reservation,) = planned
    assert now + timedelta(hours=2) <= reservation.start <= now + timedelta(hours=3)


def test_it_runs_fractions_of_two_users_on_the_shared_gpu_and_one_waits(demo):
    made = demo_queue_seed()
    shared = Gpu.objects.get(sharing=Gpu.Sharing.SHARED)
    fractions = Booking.objects.filter(pk__in=made, gpu_fraction__isnull=False)
    running = [b for b in fractions if b.state == Booking.State.ACTIVE]
    held = Allocation.objects.filter(booking__in=running, live=True)
    assert {a.gpu.uuid for a in held} == {shared.uuid}
    assert sorted(a.share for a in held) == [0.25, 0.25, 0.5]
    assert len({b.owner_id for b in running}) == 3
    (waiting,) = [b for b in fractions if b.state == Booking.State.PENDING]
    assert (waiting.pending_reason, waiting.gpu_fraction) == ("resources", 0.25)
    first_end = min(a.end for a in held)
    assert abs((waiting.planned_start - first_end).total_seconds()) < 5
    # Nothing whole on it, and whole GPUs keep off it.
    assert not Allocation.objects.filter(gpu=shared, live=True, gpu_memory_mib__isnull=True)


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
    assert {b.pending_reason for b in waiting} == {"resources"}
    assert Booking.objects.filter(pk__in=again, state="active", borrowed=True).count() == 1
    assert Booking.objects.filter(pk__in=again, state="planned").count() == 1


def test_it_counts_only_its_own_bookings_as_the_demo_queue(demo):
    alice = get_user_model().objects.get(username="alice")
    visitor = booking_submit(user=alice, now=timezone.now(), gpus=1, duration_s=3600)
    assert visitor.state in ("pending", "active")

    assert len(demo_queue_seed()) == 11


def test_it_holds_the_weekly_class_for_vision_and_runs_an_outsiders_short_booking_first(demo):
    made = demo_queue_seed()
    (reservation,) = ProjectReservation.objects.all()
    assert reservation.weekly and reservation.project.slug == "vision"
    assert reservation.gpus == 4 and reservation.gpu_model == "A100-80GB"
    short = Booking.objects.get(pk=made[len(DEMO_RUNNING)])  # the one before the class
    assert short.project.slug == "nlp" and short.state == Booking.State.ACTIVE
    held = list(short.allocations.filter(live=True))
    assert held and max(a.end for a in held) <= reservation.start  # it ends before the window
    # An outsider's booking across the window never gets the class's devices; a member's
    # (here on the class's devices or beside them) starts now.
    bob = get_user_model().objects.get(username="bob")
    alice = get_user_model().objects.get(username="alice")
    # One A100 is free beside the running ones and carol's borrowed four.
    ask = {"gpus": 1, "gpu_model": "A100-80GB", "duration_s": 3 * 3600}
    mine = booking_submit(user=alice, now=timezone.now(), project="vision", **ask)
    outsider = booking_submit(user=bob, now=timezone.now(), project="nlp", **ask)
    allocation_pass(now=timezone.now())
    mine.refresh_from_db()
    assert mine.state == Booking.State.ACTIVE, (mine.pending_reason, mine.state_detail)
    holds = snapshot_take(now=timezone.now()).state.holds
    assert len(holds) == 4  # its windows in the planning horizon (28 days)
    hold = min(holds, key=lambda h: h.start)
    assert len(hold.device_ids) == 4
    for alloc in Allocation.objects.filter(live=True).exclude(booking__project__slug="vision"):
        if to_epoch(alloc.end) > hold.start:
            assert f"gpu:{alloc.gpu_id}" not in hold.device_ids, alloc.booking_id
    outsider.refresh_from_db()
    if outsider.state == Booking.State.PENDING:
        assert outsider.pending_reason in (
            "project_reservation",
            "reservation",
            "resources",
            "priority",
        )
