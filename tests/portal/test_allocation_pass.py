"""The allocation pass: the pure allocator's plan applied to the database, by Celery or in-process."""

import os
import subprocess
import sys
import threading
import time
from datetime import timedelta

import pytest
from django.db import connection, connections
from django.utils import timezone

from portal.models import Booking, Membership, Node
from portal.services.allocation.allocation import PASS_LOCK_KEY, allocation_pass
from tests.conftest import error_of
from tests.factories import UserFactory, make_mig_gpu, make_node, member

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _after_commit(django_capture_on_commit_callbacks):
    """Run after-commit effects (the allocation pass) as a real commit would."""
    global _commits
    _commits = django_capture_on_commit_callbacks


def _submit(api, **body):
    with _commits(execute=True):
        response = api.post("/api/v1/bookings/", body, format="json")
    assert response.status_code == 201, response.json()
    return response.json()


def _get(api, booking_id):
    return api.get(f"/api/v1/bookings/{booking_id}/").json()


@pytest.mark.both_databases
def test_it_starts_a_queued_booking_on_free_devices_without_anyone_touching_it(
    api, project, cluster
):
    booking = _submit(api, gpus=2, duration_s=3600)
    # Submission asks for a pass after commit; in tests Celery runs it eagerly.
    now = _get(api, booking["id"])
    assert now["state"] == "active"
    assert len(now["devices"]) == 2 and len({d["node"] for d in now["devices"]}) == 1
    assert now["started_at"] and now["cuda_visible_devices"].startswith("GPU-")


@pytest.mark.both_databases
def test_it_shows_a_pending_bookings_planned_start_position_reason_and_priority(
    api, project, cluster
):
    project.quotas.update(max_gpus=None)
    hog = _submit(api, gpus=16, duration_s=7200)
    waiting = _get(api, _submit(api, gpus=4, duration_s=600)["id"])
    assert _get(api, hog["id"])["state"] == "active"
    assert waiting["state"] == "pending"
    assert waiting["queue_position"] == 1
    assert waiting["pending_reason"] == "resources"
    assert waiting["state_detail"]
    planned = timezone.datetime.fromisoformat(waiting["planned_start"])
    hog_end = timezone.datetime.fromisoformat(_get(api, hog["id"])["devices"][0]["end"])
    assert abs((planned - hog_end).total_seconds()) < 5
    assert set(waiting["priority"]) == {
        "total",
        "age",
        "fairshare",
        "size",
        "qos",
        "fairshare_charge",
    }
    assert waiting["priority"]["fairshare_charge"] == "allocated"


@pytest.mark.both_databases
def test_it_keeps_a_booking_pending_for_quota_while_the_user_holds_their_limit(
    api, project, cluster
):
    project.quotas.update(max_gpus=2)
    _submit(api, gpus=2, duration_s=3600)
    waiting = _get(api, _submit(api, gpus=1, duration_s=600)["id"])
    assert waiting["state"] == "pending"
    assert waiting["pending_reason"] == "quota"
    assert "2" in waiting["state_detail"]


def test_it_never_places_on_a_down_or_draining_node(api, project, db):
    make_node("down-1", state=Node.State.DOWN)
    make_node("drain-1", state=Node.State.DRAIN)
    waiting = _get(api, _submit(api, gpus=1, duration_s=600)["id"])
    assert waiting["state"] == "pending"
    assert waiting["pending_reason"] == "node_down"


def test_it_starts_a_mig_request_on_a_matching_slice(api, project, db):
    node = make_node("mig-1", gpus=0)
    make_mig_gpu(node, 0)
    booking = _get(api, _submit(api, mig_profile="3g.40gb", duration_s=600)["id"])
    assert booking["state"] == "active"
    assert "/3g.40gb@" in booking["devices"][0]["device"]  # gpu0/3g.40gb@<first slice>
    assert booking["cuda_visible_devices"].startswith("MIG-")


@pytest.mark.both_databases
def test_it_ends_bookings_at_their_end_time_and_starts_the_next(api, project, cluster):
    project.quotas.update(max_gpus=None)
    first = _submit(api, gpus=16, duration_s=600)
    second = _submit(api, gpus=16, duration_s=600)
    assert _get(api, second["id"])["state"] == "pending"
    allocation_pass(now=timezone.now() + timedelta(seconds=601))
    assert _get(api, first["id"])["state"] == "finished"
    assert _get(api, second["id"])["state"] == "active"


def test_it_preempts_a_preemptible_lower_qos_booking_after_the_grace_period(
    api, user, project, cluster, settings
):
    project.quotas.update(max_gpus=None, allowed_qos=None)
    settings.SCHEDULER_POLICY = {**settings.SCHEDULER_POLICY, "preempt_grace_s": 300}
    batch = _submit(
        api, gpus=16, duration_s=86400, qos="low", preemptible=True, command="python train.py"
    )
    urgent = _submit(api, gpus=8, duration_s=3600, qos="high")
    waiting = _get(api, urgent["id"])
    assert waiting["state"] == "pending"  # within the grace period, and it says what comes
    graced = Booking.objects.get(pk=urgent["id"]).submitted_at + timedelta(seconds=300)
    assert (waiting["pending_reason"], waiting["state_detail"]) == (
        "preempting",
        f"will preempt booking {batch['id']} at {graced:%Y-%m-%d %H:%M} UTC",
    )
    # The planned start stays the one its devices are held for (when the batch ends): a bound.
    planned = timezone.datetime.fromisoformat(waiting["planned_start"])
    ends = Booking.objects.get(pk=batch["id"]).allocations.order_by("-end").first().end
    assert abs((planned - ends).total_seconds()) < 1
    allocation_pass(now=timezone.now() + timedelta(seconds=301))
    requeued = Booking.objects.get(pk=batch["id"])
    assert requeued.state == "pending" and "preempted" in requeued.state_detail
    assert not requeued.allocations.filter(live=True).exists()
    allocation_pass(now=timezone.now() + timedelta(seconds=302))
    assert _get(api, urgent["id"])["state"] == "active"


def test_it_never_preempts_a_booking_that_is_not_preemptible(api, project, cluster):
    project.quotas.update(max_gpus=None)
    holder = _submit(api, gpus=16, duration_s=86400, qos="low")
    urgent = _submit(api, gpus=8, duration_s=3600, qos="high")
    allocation_pass(now=timezone.now() + timedelta(hours=1))
    assert _get(api, holder["id"])["state"] == "active"
    assert _get(api, urgent["id"])["state"] == "pending"


@pytest.mark.both_databases
def test_it_estimates_the_start_of_a_request_before_it_is_submitted(api, project, cluster):
    project.quotas.update(max_gpus=None)
    hog = _submit(api, gpus=16, duration_s=7200)
    response = api.post("/api/v1/bookings/estimate/", {"gpus": 2, "duration_s": 600}, format="json")
    assert response.status_code == 200, response.json()
    body = response.json()
    hog_end = timezone.datetime.fromisoformat(_get(api, hog["id"])["end"])
    assert body["pending_reason"] == "resources" and body["queue_position"] == 1
    assert "earliest_start" not in body and "reason" not in body  # named as on a booking
    assert (
        abs((timezone.datetime.fromisoformat(body["planned_start"]) - hog_end).total_seconds()) < 5
    )
    assert Booking.objects.count() == 1  # nothing written
    free = api.post(
        "/api/v1/bookings/estimate/",
        {
            "gpus": 2,
            "start": hog_end.isoformat(),
            "end": (hog_end + timedelta(hours=1)).isoformat(),
        },
        format="json",
    )
    assert free.json()["pending_reason"] == "fits" and free.json()["queue_position"] is None


def test_it_validates_an_estimate_like_a_submission(api, project, cluster):
    response = api.post(
        "/api/v1/bookings/estimate/", {"gpus": 99, "duration_s": 600}, format="json"
    )
    assert response.status_code == 409
    assert error_of(response)["code"] == "no_capacity" and "gpus" in error_of(response)["fields"]
    response = api.post("/api/v1/bookings/estimate/", {"gpus": 1}, format="json")
    assert response.status_code == 400 and "duration_s" in error_of(response)["fields"]


def test_it_skips_a_pass_while_another_holds_the_lock(project, cluster):
    def hold():
        with connections["default"].cursor() as cursor:
            cursor.execute("SELECT pg_advisory_lock(%s)", [PASS_LOCK_KEY])
            held.set()
            release.wait(10)
            cursor.execute("SELECT pg_advisory_unlock(%s)", [PASS_LOCK_KEY])
        connections["default"].close()

    held, release = threading.Event(), threading.Event()
    thread = threading.Thread(target=hold)
    thread.start()
    held.wait(10)
    try:
        assert allocation_pass(now=timezone.now()).ran is False
    finally:
        release.set()
        thread.join()
    assert allocation_pass(now=timezone.now()).ran is True


@pytest.mark.django_db(transaction=True)
def test_it_runs_the_pass_in_a_real_celery_worker_against_postgresql(settings):
    from portal.celery import app

    user = UserFactory(username="celery-user")
    from tests.factories import ProjectFactory, QuotaFactory

    project = ProjectFactory(slug="celery")
    QuotaFactory(project=project)
    member(user, project, Membership.Role.MEMBER)
    make_node("celery-node", gpus=2)
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "portal.settings_test",
        "DATABASE_URL": f"postgres://postgres@127.0.0.1:5432/{connection.settings_dict['NAME']}",
        "CELERY_WORKER_EAGER": "0",
    }
    worker = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "portal",
            "worker",
            "--pool",
            "solo",
            "--loglevel",
            "WARNING",
            "--queues",
            f"{settings.CELERY_TASK_DEFAULT_QUEUE},{settings.CELERY_PASS_QUEUE}",
        ],
        cwd=settings.BASE_DIR,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    app.conf.task_always_eager = False
    try:
        from rest_framework.test import APIClient

        client = APIClient()
        client.force_authenticate(user)
        booking = client.post(
            "/api/v1/bookings/", {"gpus": 2, "duration_s": 600}, format="json"
        ).json()
        assert booking["state"] == "pending"  # the request itself did not run the pass
        deadline = time.monotonic() + 60
        while (
            time.monotonic() < deadline and Booking.objects.get(pk=booking["id"]).state == "pending"
        ):
            time.sleep(0.5)
        assert Booking.objects.get(pk=booking["id"]).state == "active"
        assert Booking.objects.get(pk=booking["id"]).allocations.filter(live=True).count() == 2
    finally:
        app.conf.task_always_eager = True
        worker.terminate()
        worker.wait(timeout=30)


def test_it_runs_the_workers_with_the_policy_the_replay_measures(settings):
    from portal.services.allocation.snapshot import scheduler_policy
    from scheduler.replay import PORTAL_POLICY

    settings.SCHEDULER_POLICY = {}
    assert scheduler_policy() == PORTAL_POLICY
    settings.SCHEDULER_POLICY = {"preempt_grace_s": 60.0}
    assert scheduler_policy().preempt_grace_s == 60.0


def _reservation_on(api, node_name: str, hours_from_now: float = 1.0):
    start = timezone.now() + timedelta(hours=hours_from_now)
    body = _submit(
        api, gpus=8, start=start.isoformat(), end=(start + timedelta(hours=2)).isoformat()
    )
    assert {d["node"] for d in body["devices"]} == {node_name}
    return body, start


@pytest.mark.both_databases
def test_it_moves_a_reservation_off_a_node_that_went_down_when_its_window_opens(
    api, project, cluster
):
    booking, start = _reservation_on(api, "node-a")
    Node.objects.filter(hostname="node-a").update(state=Node.State.DOWN)
    allocation_pass(now=start + timedelta(seconds=1))
    moved = _get(api, booking["id"])
    assert moved["state"] == "active"
    assert {d["node"] for d in moved["devices"]} == {"node-b"} and len(moved["devices"]) == 8
    assert "moved off node-a" in moved["state_detail"]


@pytest.mark.both_databases
def test_it_fails_a_reservation_whose_node_is_down_when_nothing_else_is_free(api, project, cluster):
    from django.core import mail

    project.quotas.update(max_gpus=None)
    booking, start = _reservation_on(api, "node-a")
    _reservation_on(api, "node-b")
    Node.objects.filter(hostname="node-a").update(state=Node.State.DOWN)
    with _commits(execute=True):
        allocation_pass(now=start + timedelta(seconds=1))
    failed = _get(api, booking["id"])
    assert failed["state"] == "failed"
    assert (
        failed["state_detail"] == "node node-a is down and no other devices are free for the window"
    )
    assert any(f"Booking {booking['id']} failed" in m.subject for m in mail.outbox)


@pytest.mark.both_databases
def test_it_builds_the_policy_once_a_pass(project, user, cluster, monkeypatch):
    import scheduler
    from portal.services.allocation import snapshot

    Booking.objects.create(
        owner=user, project=project, gpus=1, duration_s=600, submitted_at=timezone.now()
    )
    built = []
    real = scheduler.Policy

    def policy(**fields):
        built.append(fields)
        return real(**fields)

    monkeypatch.setattr(snapshot.scheduler, "Policy", policy)
    assert allocation_pass(now=timezone.now()).started == 1
    assert len(built) == 1
