"""Admins edit quotas and see usage beside limits; owners hear about queue events."""

import json
import threading
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest
from django.core import mail
from django.utils import timezone

from portal.services.notifications import booking_notify
from tests.factories import AllocationFactory, BookingFactory, make_node

pytestmark = pytest.mark.django_db


def test_it_lists_quotas_with_usage_beside_each_limit(admin_client, user, project):
    project.quotas.update(max_gpus=8, gpu_hours_budget=100)
    gpu = make_node("n1", gpus=1).gpus.get()
    now = timezone.now()
    booking = BookingFactory(owner=user, project=project, state="active")
    AllocationFactory(
        booking=booking, gpu=gpu, start=now - timedelta(hours=3), end=now + timedelta(hours=1)
    )
    html = admin_client.get("/admin/portal/quota/").content.decode()
    assert "GPUs in use / limit" in html
    assert "1 / 8" in html
    assert "3.0 / 100" in html


def test_it_lets_an_admin_override_a_users_quota(admin_client, user, project):
    response = admin_client.post(
        "/admin/portal/quota/add/",
        {
            "project": project.pk,
            "user": user.pk,
            "max_gpus": "2",
            "allowed_models": "",
            "allowed_qos": "",
        },
    )
    assert response.status_code == 302, response.content.decode()[:2000]
    assert project.quotas.get(user=user).max_gpus == 2


def test_it_refuses_a_malformed_model_list_in_the_admin(admin_client, user, project):
    response = admin_client.post(
        "/admin/portal/quota/add/",
        {
            "project": project.pk,
            "user": user.pk,
            "allowed_models": '"A100"',
            "allowed_qos": "",
        },
    )
    assert response.status_code == 200
    assert "Enter a list of names" in response.content.decode()
    assert not project.quotas.filter(user=user).exists()


def test_it_refuses_a_second_project_row(admin_client, project):
    response = admin_client.post(
        "/admin/portal/quota/add/", {"project": project.pk, "allowed_models": "", "allowed_qos": ""}
    )
    assert response.status_code == 200
    assert project.quotas.count() == 1


def test_it_emails_the_owner_when_a_booking_starts(user, project):
    booking = BookingFactory(owner=user, project=project, state="active")
    assert booking_notify(booking=booking, event="started")
    assert len(mail.outbox) == 1
    assert mail.outbox[0].to == ["alice@example.org"]
    assert f"Booking {booking.pk} is active: 1 GPU" in mail.outbox[0].subject


def test_it_stays_quiet_about_queueing_an_asap_request(user, project):
    assert not booking_notify(
        booking=BookingFactory(owner=user, project=project), event="submitted"
    )
    assert mail.outbox == []


def test_it_posts_queue_events_to_slack(user, project, settings):
    received: list[dict] = []

    class Hook(BaseHTTPRequestHandler):
        def do_POST(self):
            received.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = HTTPServer(("127.0.0.1", 0), Hook)
    threading.Thread(target=server.handle_request, daemon=True).start()
    settings.SLACK_WEBHOOK_URL = f"http://127.0.0.1:{server.server_port}/hook"
    booking = BookingFactory(
        owner=user, project=project, state="preempted", state_detail="for booking 9"
    )
    booking_notify(booking=booking, event="preempted")
    server.server_close()
    assert len(received) == 1
    assert received[0]["text"].startswith(f"alice (vision): Booking {booking.pk} was preempted")


def test_it_survives_an_unreachable_slack(user, project, settings):
    settings.SLACK_WEBHOOK_URL = "http://127.0.0.1:9/unreachable"
    assert booking_notify(booking=BookingFactory(owner=user, project=project), event="failed")
    assert len(mail.outbox) == 1


def test_it_sends_notifications_only_after_commit(
    api, user, project, cluster, django_capture_on_commit_callbacks
):
    start = timezone.now() + timedelta(hours=1)
    body = {"gpus": 1, "start": start.isoformat(), "end": (start + timedelta(hours=1)).isoformat()}
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        assert api.post("/api/v1/bookings/", body, format="json").status_code == 201
    assert mail.outbox == [] and callbacks
    for callback in callbacks:
        callback()
    assert [m.subject.split(":")[0] for m in mail.outbox] == [
        f"Booking {user.bookings.get().pk} reserved"
    ]
