"""The periodic notifications: queued (position, planned start), planned start moved, starting
soon, ending soon, budget nearly used; each once per occurrence however often the scan runs."""

from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from portal.models import Allocation, Booking, Delivery, Notification
from portal.services.notify.notify_scan import notifications_scan
from tests.factories import AllocationFactory, BookingFactory, make_active_booking, make_node

pytestmark = pytest.mark.django_db


def _events(booking):
    return list(
        Notification.objects.filter(booking=booking).order_by("id").values_list("event", flat=True)
    )


def test_it_tells_a_queued_request_its_place_then_a_big_move(owner, project, settings):
    settings.NOTIFY_MOVED_THRESHOLD_MIN = 30
    now = timezone.now()
    b = BookingFactory(owner=owner, project=project, planned_start=now + timedelta(hours=1),
                       queue_position=3)  # fmt: skip
    notifications_scan(now=now)
    notifications_scan(now=now)
    assert _events(b) == ["queued"]
    Booking.objects.filter(pk=b.pk).update(planned_start=now + timedelta(hours=1, minutes=20))
    notifications_scan(now=now)
    assert _events(b) == ["queued"]  # under the threshold
    Booking.objects.filter(pk=b.pk).update(planned_start=now + timedelta(hours=3))
    notifications_scan(now=now)
    notifications_scan(now=now)
    assert _events(b) == ["queued", "moved"]
    from portal.services.notify.messages import message_build

    message = message_build(Notification.objects.get(event="moved"))
    assert "position 3" in message.intro


def test_it_says_a_reservation_starts_soon_once(owner, project, settings):
    settings.NOTIFY_STARTING_SOON_MIN = 15
    now = timezone.now()
    start = now + timedelta(minutes=10)
    b = BookingFactory(owner=owner, project=project, state="planned", start=start,
                       end=start + timedelta(hours=1))  # fmt: skip
    notifications_scan(now=now)
    notifications_scan(now=now + timedelta(minutes=1))
    assert _events(b) == ["starting_soon"]


def test_it_says_ending_soon_again_after_an_extension(owner, project, settings):
    settings.NOTIFY_ENDING_SOON_MIN = 15
    b = make_active_booking(list(make_node("n", gpus=1).gpus.all()), owner=owner, project=project)
    now = timezone.now()
    Allocation.objects.filter(booking=b).update(end=now + timedelta(minutes=10))
    notifications_scan(now=now)
    notifications_scan(now=now)
    Allocation.objects.filter(booking=b).update(end=now + timedelta(minutes=14))
    notifications_scan(now=now)
    assert _events(b) == ["ending_soon", "ending_soon"]


def test_it_warns_when_the_budget_is_nearly_used(owner, project, settings):
    project.quotas.update(gpu_hours_budget=10)
    now = timezone.now()
    used = BookingFactory(owner=owner, project=project, state="finished")
    AllocationFactory(booking=used, start=now - timedelta(hours=9.5), end=now, live=False)
    live = BookingFactory(owner=owner, project=project)
    notifications_scan(now=now)
    notifications_scan(now=now)
    assert _events(live) == ["budget"]


def test_it_marks_a_send_whose_sender_died_uncertain_and_never_resends_it(owner, settings):
    now = timezone.now()
    note = Notification.objects.create(event="started", created=now)
    stuck = Delivery.objects.create(
        notification=note, event="started", channel="email", recipient="a@example.org",
        idempotency_key="k1", status="sending", created=now, claimed_at=now,
    )  # fmt: skip
    notifications_scan(now=now + timedelta(minutes=1))
    assert Delivery.objects.get(pk=stuck.pk).status == "sending"  # may still be in flight
    notifications_scan(now=now + timedelta(minutes=10))
    assert Delivery.objects.get(pk=stuck.pk).status == "uncertain"


def test_it_words_an_extension_of_a_queued_request_by_its_length(owner, project):
    from django.db import transaction

    from portal.services.notify.messages import message_build
    from portal.services.notify.notifications import booking_event_record

    b = BookingFactory(owner=owner, project=project, duration_s=7200)
    with transaction.atomic():
        booking_event_record(booking_id=b.pk, event="extended")
    message = message_build(Notification.objects.get(event="extended"))
    assert message.subject == f"Booking {b.pk} now asks for 2 hours"


def test_it_scans_a_long_queue_and_its_budgets_in_a_fixed_number_of_queries(
    owner, project, django_assert_max_num_queries
):
    """A site's queue holds thousands of waiting requests: the scan must not read each one's
    last message, quota and usage by itself."""
    project.quotas.update(gpu_hours_budget=1000)
    now = timezone.now()

    def queue(count):
        for i in range(count):
            BookingFactory(owner=owner, project=project, planned_start=now + timedelta(hours=i))

    queue(3)
    notifications_scan(now=now)  # each told its place once
    with CaptureQueriesContext(connection) as few:
        notifications_scan(now=now)
    queue(20)
    notifications_scan(now=now)
    with django_assert_max_num_queries(len(few.captured_queries)):
        notifications_scan(now=now)
