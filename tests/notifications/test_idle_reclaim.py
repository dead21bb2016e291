"""Idle reclaim: a booking whose devices sit idle is warned with a 'keep it' link, and released
when nobody keeps it within the grace time; the next booking in the queue then starts."""

from datetime import timedelta

import pytest
from django.utils import timezone

from portal.models import AuditEvent, Booking, Delivery, IdleReclaim, Notification, ProcessUsage
from portal.services.notify.reclaim import idle_reclaim_scan
from tests.factories import (
    BookingFactory,
    SampleFactory,
    make_active_booking,
    make_mig_gpu,
    make_node,
)

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def policy(settings):
    settings.IDLE_RECLAIM_ENABLED = True
    settings.IDLE_UTIL_THRESHOLD = 5.0
    settings.IDLE_MINUTES = 10
    settings.IDLE_GRACE_MINUTES = 5


def _readings(devices, start, minutes, **values):
    for device in devices:
        node = device.gpu.node if hasattr(device, "gpu") else device.node
        for m in range(minutes + 1):
            SampleFactory(node=node, uuid=device.uuid, time=start + timedelta(minutes=m), **values)


@pytest.fixture
def idle_booking(owner, project):
    gpus = list(make_node("idle-a", gpus=1).gpus.all())
    booking = make_active_booking(gpus, owner=owner, project=project)
    Booking.objects.filter(pk=booking.pk).update(started_at=timezone.now() - timedelta(hours=1))
    return booking, gpus


def test_it_warns_then_releases_an_idle_booking_and_the_queue_moves_up(
    idle_booking, owner, project, django_capture_on_commit_callbacks
):
    booking, gpus = idle_booking
    now = timezone.now()
    _readings(gpus, now - timedelta(minutes=11), 18, utilization_gpu=1.0, memory_used_mib=300)
    waiting = BookingFactory(owner=owner, project=project, duration_s=600)
    with django_capture_on_commit_callbacks(execute=True):
        assert idle_reclaim_scan(now=now)["warned"] == 1
    warning = IdleReclaim.objects.get(booking=booking)
    assert warning.state == "warned"
    (mail,) = Delivery.objects.filter(event="idle", channel="email")
    assert mail.status == "sent" and mail.recipient == "alice@example.org"
    with django_capture_on_commit_callbacks(execute=True):
        assert idle_reclaim_scan(now=now + timedelta(minutes=2))["released"] == 0  # grace
        assert idle_reclaim_scan(now=now + timedelta(minutes=6))["released"] == 1
    booking.refresh_from_db()
    assert booking.state == "finished"
    assert IdleReclaim.objects.get(booking=booking).state == "released"
    assert Notification.objects.filter(booking=booking, event="reclaimed").count() == 1
    assert not Notification.objects.filter(booking=booking, event="ended").exists()
    assert Booking.objects.get(pk=waiting.pk).state == "active"
    (audit,) = AuditEvent.objects.filter(target_id=str(booking.pk), action__startswith="booking.")
    assert (audit.action, audit.actor, audit.via) == ("booking.reclaim", None, "system")
    assert (audit.before["state"], audit.after["state"]) == ("active", "finished")


def test_it_leaves_a_kept_booking_alone(idle_booking):
    from portal.services.notify.reclaim import idle_keep

    booking, gpus = idle_booking
    now = timezone.now()
    _readings(gpus, now - timedelta(minutes=11), 18, utilization_gpu=0.0)
    idle_reclaim_scan(now=now)
    idle_keep(booking_id=booking.pk, now=now + timedelta(minutes=1))
    assert idle_reclaim_scan(now=now + timedelta(minutes=6)) == {
        "warned": 0, "released": 0, "busy": 0,
    }  # fmt: skip
    assert Booking.objects.get(pk=booking.pk).state == "active"


def test_it_does_not_call_a_busy_booking_idle(idle_booking):
    booking, gpus = idle_booking
    now = timezone.now()
    _readings(gpus, now - timedelta(minutes=11), 11, utilization_gpu=80.0)
    assert idle_reclaim_scan(now=now)["warned"] == 0


def test_it_does_not_call_idle_a_booking_whose_owner_holds_gpu_memory(idle_booking):
    booking, gpus = idle_booking
    now = timezone.now()
    _readings(gpus, now - timedelta(minutes=11), 11, utilization_gpu=0.0)
    ProcessUsage.objects.create(
        node=gpus[0].node, device_uuid=gpus[0].uuid, booking=booking, booking_key=booking.pk,
        pid=4242, user="alice", name="python", first_seen=now - timedelta(hours=1),
        last_seen=now, peak_memory_mib=20000,
    )  # fmt: skip
    assert idle_reclaim_scan(now=now)["warned"] == 0


def test_it_closes_the_warning_when_the_devices_get_busy_again(idle_booking):
    booking, gpus = idle_booking
    now = timezone.now()
    _readings(gpus, now - timedelta(minutes=11), 11, utilization_gpu=0.0)
    idle_reclaim_scan(now=now)
    _readings(gpus, now + timedelta(minutes=1), 2, utilization_gpu=90.0)
    assert idle_reclaim_scan(now=now + timedelta(minutes=6))["busy"] == 1
    assert Booking.objects.get(pk=booking.pk).state == "active"


def test_it_judges_a_mig_slice_by_its_memory(owner, project):
    node = make_node("mig-a", gpus=0)
    slices = list(make_mig_gpu(node, 0).mig_instances.order_by("id")[:2])
    idle = make_active_booking(
        [slices[0]], owner=owner, project=project, gpus=0, mig_profile="3g.40gb"
    )
    busy = make_active_booking(
        [slices[1]], owner=owner, project=project, gpus=0, mig_profile="2g.20gb"
    )
    Booking.objects.update(started_at=timezone.now() - timedelta(hours=1))
    now = timezone.now()
    _readings([slices[0]], now - timedelta(minutes=11), 11, utilization_gpu=None, memory_used_mib=0)
    _readings(
        [slices[1]], now - timedelta(minutes=11), 11, utilization_gpu=None, memory_used_mib=9000
    )
    idle_reclaim_scan(now=now)
    assert list(IdleReclaim.objects.values_list("booking_id", flat=True)) == [idle.pk]
    assert busy.pk != idle.pk


def test_it_is_off_unless_the_site_turns_it_on(idle_booking, settings):
    settings.IDLE_RECLAIM_ENABLED = False
    booking, gpus = idle_booking
    _readings(gpus, timezone.now() - timedelta(minutes=11), 11, utilization_gpu=0.0)
    assert idle_reclaim_scan(now=timezone.now())["warned"] == 0


def test_it_takes_a_projects_own_thresholds(idle_booking, project):
    from portal.models import ProjectNotificationSettings

    ProjectNotificationSettings.objects.create(project=project, idle_util_threshold=50)
    booking, gpus = idle_booking
    _readings(gpus, timezone.now() - timedelta(minutes=11), 11, utilization_gpu=30.0)
    assert idle_reclaim_scan(now=timezone.now())["warned"] == 1


def test_it_does_not_warn_a_booking_younger_than_the_idle_window(owner, project):
    # The GPU sat idle for an hour before the booking started on it a minute ago: that hour is
    # not the booking's, so the booking is not idle yet.
    gpus = list(make_node("idle-young", gpus=1).gpus.all())
    booking = make_active_booking(gpus, owner=owner, project=project)
    now = timezone.now()
    _readings(gpus, now - timedelta(minutes=60), 60, utilization_gpu=0.0)
    assert idle_reclaim_scan(now=now)["warned"] == 0
    assert not IdleReclaim.objects.filter(booking=booking).exists()


def test_it_warns_a_booking_once_idle_for_the_window_since_it_started(owner, project):
    gpus = list(make_node("idle-later", gpus=1).gpus.all())
    booking = make_active_booking(gpus, owner=owner, project=project)
    started = Booking.objects.get(pk=booking.pk).started_at
    _readings(gpus, started - timedelta(minutes=60), 60 + 11, utilization_gpu=0.0)
    assert idle_reclaim_scan(now=started + timedelta(minutes=5))["warned"] == 0
    assert idle_reclaim_scan(now=started + timedelta(minutes=11))["warned"] == 1
    assert IdleReclaim.objects.get(booking=booking).state == "warned"


def test_it_judges_a_requeued_booking_by_its_current_run(owner, project):
    # A booking that ran earlier, was requeued and started again a minute ago: its earlier run's
    # idle telemetry does not count against the new one.
    gpus = list(make_node("idle-rerun", gpus=1).gpus.all())
    booking = make_active_booking(gpus, owner=owner, project=project)
    now = timezone.now()
    Booking.objects.filter(pk=booking.pk).update(
        requeued_at=now - timedelta(minutes=2), started_at=now - timedelta(minutes=1)
    )
    _readings(gpus, now - timedelta(minutes=60), 60, utilization_gpu=0.0)
    assert idle_reclaim_scan(now=now)["warned"] == 0


def test_it_does_not_release_a_new_run_on_a_warning_from_the_last_one(owner, project):
    gpus = list(make_node("idle-stale", gpus=1).gpus.all())
    booking = make_active_booking(gpus, owner=owner, project=project)
    now = timezone.now()
    IdleReclaim.objects.create(booking=booking, warned_at=now - timedelta(hours=2))
    Booking.objects.filter(pk=booking.pk).update(
        requeued_at=now - timedelta(minutes=2), started_at=now - timedelta(minutes=1)
    )
    _readings(gpus, now - timedelta(hours=3), 180, utilization_gpu=0.0)
    assert idle_reclaim_scan(now=now)["released"] == 0
    assert Booking.objects.get(pk=booking.pk).state == "active"
    assert IdleReclaim.objects.get(booking=booking).state == "busy"
