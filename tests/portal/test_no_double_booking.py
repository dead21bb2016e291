"""No device is ever given to two bookings at once: PostgreSQL enforces it, even under races."""

import threading
from datetime import timedelta

import pytest
from django.db import IntegrityError, OperationalError, connection, transaction
from django.utils import timezone
from rest_framework.test import APIClient

from portal.models import Allocation, Booking
from portal.services.core.locking import is_allocation_clash
from tests.factories import AllocationFactory, BookingFactory, MigInstanceFactory, make_node
from tests.races import post_at_once


@pytest.mark.django_db
def test_it_refuses_two_live_allocations_of_one_gpu_that_overlap():
    gpu = make_node("n1", gpus=1).gpus.get()
    start = timezone.now()
    AllocationFactory(gpu=gpu, start=start, end=start + timedelta(hours=2))
    with pytest.raises(IntegrityError, match="portal_allocation_no_overlap"), transaction.atomic():
        AllocationFactory(gpu=gpu, start=start + timedelta(hours=1), end=start + timedelta(hours=3))


@pytest.mark.django_db
def test_it_allows_back_to_back_and_released_allocations():
    gpu = make_node("n1", gpus=1).gpus.get()
    start = timezone.now()
    AllocationFactory(gpu=gpu, start=start, end=start + timedelta(hours=1))
    AllocationFactory(gpu=gpu, start=start + timedelta(hours=1), end=start + timedelta(hours=2))
    AllocationFactory(gpu=gpu, start=start, end=start + timedelta(hours=2), live=False)
    assert Allocation.objects.count() == 3


@pytest.mark.django_db
def test_it_treats_each_mig_instance_as_its_own_device():
    a = MigInstanceFactory()
    b = MigInstanceFactory(gpu=a.gpu)
    start = timezone.now()
    AllocationFactory(gpu=a.gpu, mig_instance=a, start=start, end=start + timedelta(hours=1))
    AllocationFactory(gpu=a.gpu, mig_instance=b, start=start, end=start + timedelta(hours=1))
    with pytest.raises(IntegrityError), transaction.atomic():
        AllocationFactory(gpu=a.gpu, mig_instance=a, start=start, end=start + timedelta(minutes=30))


@pytest.mark.django_db
def test_it_checks_the_constraint_in_the_database_itself():
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_get_constraintdef(oid) FROM pg_constraint WHERE conname = %s",
            ["portal_allocation_no_overlap"],
        )
        (definition,) = cursor.fetchone()
    assert "EXCLUDE USING gist" in definition and "WHERE (live)" in definition


@pytest.mark.django_db(transaction=True)
def test_it_gives_a_contended_device_to_exactly_one_of_two_concurrent_requests():
    from tests.factories import ProjectFactory, QuotaFactory, UserFactory, member

    make_node("only", gpus=1)
    project = ProjectFactory(slug="race")
    QuotaFactory(project=project)
    users = [UserFactory(username=f"racer{i}") for i in range(2)]
    for u in users:
        member(u, project)
    start = timezone.now() + timedelta(hours=1)
    body = {"gpus": 1, "start": start.isoformat(), "end": (start + timedelta(hours=1)).isoformat()}
    statuses = post_at_once(users, "/api/v1/bookings/", body)
    assert sorted(statuses) == [201, 409]
    assert Booking.objects.filter(state="planned").count() == 1
    assert Allocation.objects.filter(live=True).count() == 1


@pytest.mark.django_db(transaction=True)
def test_it_backstops_a_writer_that_skips_the_lock():
    gpu = make_node("n1", gpus=1).gpus.get()
    start = timezone.now()
    booking = BookingFactory()
    barrier = threading.Barrier(2)
    outcomes: list[str] = []

    def insert():
        barrier.wait()
        try:
            with transaction.atomic():
                Allocation.objects.create(
                    booking=booking,
                    gpu=gpu,
                    start=start,
                    end=start + timedelta(hours=1),
                    fraction=1.0,
                )
            outcomes.append("ok")
        except (IntegrityError, OperationalError) as exc:
            # PostgreSQL refuses the loser with the constraint, or with a deadlock when both
            # insert at the same instant; either way only one row exists.
            outcomes.append("refused" if is_allocation_clash(exc) else repr(exc))
        finally:
            connection.close()

    threads = [threading.Thread(target=insert) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(outcomes) == ["ok", "refused"]
    assert Allocation.objects.filter(gpu=gpu, live=True).count() == 1


def _cancel_in_a_thread(user, booking_id: int, *, wait_s: float) -> threading.Thread:
    """Cancel the booking from another connection; wait up to wait_s for it (it may block)."""
    from portal.services.booking.bookings import booking_cancel

    def cancel():
        try:
            booking_cancel(user=user, booking_id=booking_id, now=timezone.now())
        finally:
            connection.close()

    thread = threading.Thread(target=cancel)
    thread.start()
    thread.join(timeout=wait_s)
    return thread


@pytest.mark.django_db(transaction=True)
def test_it_makes_a_cancel_racing_an_extension_wait_for_it(monkeypatch):
    from portal.services.booking import bookings as services
    from tests.factories import ProjectFactory, UserFactory, make_active_booking, member

    user, project = UserFactory(), ProjectFactory()
    member(user, project)
    booking = make_active_booking(make_node("n1", gpus=1).gpus.all(), owner=user, project=project)
    check_quota = services._check_extend_quota
    cancels: list[threading.Thread] = []

    def cancel_meanwhile(booking, by_s, now):
        # Without the booking row locked, the cancel commits while this waits.
        cancels.append(_cancel_in_a_thread(user, booking.pk, wait_s=1))
        check_quota(booking, by_s, now)

    monkeypatch.setattr(services, "_check_extend_quota", cancel_meanwhile)
    extended = services.booking_extend(
        user=user, booking_id=booking.pk, now=timezone.now(), by_s=3600
    )
    cancels[0].join(timeout=10)
    assert extended.duration_s == booking.duration_s + 3600
    booking.refresh_from_db()
    assert booking.state == Booking.State.CANCELLED
    assert not Allocation.objects.filter(booking=booking, live=True).exists()


@pytest.mark.django_db(transaction=True)
def test_it_checks_the_gpu_quota_of_concurrent_reservations_one_at_a_time(monkeypatch):
    from portal.errors import QuotaExceeded
    from portal.services.booking import bookings as services
    from tests.factories import ProjectFactory, QuotaFactory, UserFactory, member

    # Different models are placed on different nodes; only the project's quota (2 GPUs) is
    # shared, and its advisory lock is held from the quota check to the commit.
    make_node("a", gpus=2, model="A100-80GB")
    make_node("h", gpus=2, model="H100")
    user, project = UserFactory(), ProjectFactory(slug="race")
    member(user, project)
    QuotaFactory(project=project, max_gpus=2)
    start = timezone.now() + timedelta(hours=1)
    window = {"project": "race", "gpus": 2, "start": start, "end": start + timedelta(hours=1)}
    check_quota = services._check_window_quota
    others: list[threading.Thread] = []
    outcomes: list[str] = []

    def submit_h100():
        try:
            services.booking_submit(user=user, now=timezone.now(), gpu_model="H100", **window)
            outcomes.append("placed")
        except QuotaExceeded:
            outcomes.append("over quota")
        finally:
            connection.close()

    def second_submit_meanwhile(user, request, now, devices=None):
        check_quota(user, request, now, devices)
        if not others:
            others.append(threading.Thread(target=submit_h100))
            others[0].start()
            others[0].join(timeout=2)  # without a shared lock, it is placed here

    monkeypatch.setattr(services, "_check_window_quota", second_submit_meanwhile)
    services.booking_submit(user=user, now=timezone.now(), gpu_model="A100-80GB", **window)
    others[0].join(timeout=10)
    assert outcomes == ["over quota"]
    assert Allocation.objects.filter(live=True).count() == 2


@pytest.mark.django_db(transaction=True)
def test_it_leaves_a_reservation_cancelled_while_the_pass_moves_it_holding_nothing(monkeypatch):
    from portal.models import Node
    from portal.services.allocation.allocation import allocation_pass
    from portal.services.booking import bookings as services
    from portal.services.inventory import placement
    from tests.factories import ProjectFactory, QuotaFactory, UserFactory, member

    make_node("a", gpus=1)
    make_node("b", gpus=1)
    user, project = UserFactory(), ProjectFactory()
    member(user, project)
    QuotaFactory(project=project)
    start = timezone.now() + timedelta(seconds=5)
    booking = services.booking_submit(
        user=user, now=timezone.now(), gpus=1, start=start, end=start + timedelta(hours=1)
    )
    Node.objects.filter(gpus__allocations__booking=booking).update(state=Node.State.DOWN)
    devices_for_window = placement.devices_for_window
    cancels: list[threading.Thread] = []

    def cancel_meanwhile(**kwargs):
        # Without the booking row locked, the cancel commits while this waits.
        cancels.append(_cancel_in_a_thread(user, booking.pk, wait_s=2))
        return devices_for_window(**kwargs)

    monkeypatch.setattr(placement, "devices_for_window", cancel_meanwhile)
    allocation_pass(now=start + timedelta(seconds=1))
    cancels[0].join(timeout=10)
    booking.refresh_from_db()
    assert booking.state == Booking.State.CANCELLED
    assert not Allocation.objects.filter(booking=booking, live=True).exists()


@pytest.mark.django_db(transaction=True)
def test_it_answers_busy_with_retry_after_when_the_nodes_stay_locked(settings):
    """A writer that cannot get the node locks in time gets 503 + Retry-After, and writes nothing."""
    from tests.factories import ProjectFactory, QuotaFactory, UserFactory, member

    settings.BOOKING_LOCK_TIMEOUT_MS = 200
    node = make_node("held", gpus=1)
    project = ProjectFactory(slug="busy")
    QuotaFactory(project=project)
    user = UserFactory(username="waiter")
    member(user, project)
    held, release = threading.Event(), threading.Event()

    def hold():
        with transaction.atomic():
            list(type(node).objects.select_for_update().filter(pk=node.pk))
            held.set()
            release.wait(10)
        connection.close()

    thread = threading.Thread(target=hold)
    thread.start()
    held.wait(10)
    try:
        client = APIClient()
        client.force_authenticate(user)
        start = timezone.now() + timedelta(hours=1)
        response = client.post(
            "/api/v1/bookings/",
            {
                "gpus": 1,
                "start": start.isoformat(),
                "end": (start + timedelta(hours=1)).isoformat(),
            },
            format="json",
        )
    finally:
        release.set()
        thread.join()
    assert response.status_code == 503
    assert response["Retry-After"] == "2"
    assert response.json()["error"]["code"] == "busy"
    assert not Booking.objects.exists()
