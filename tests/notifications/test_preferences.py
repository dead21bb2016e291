"""Each user picks events by channel on a settings page and through the API; admins see sends."""

import pytest
from django.test import Client
from rest_framework.test import APIClient

from portal.models import Delivery, Notification, NotificationContact, NotificationPreference
from tests.factories import UserFactory

pytestmark = pytest.mark.django_db


@pytest.fixture
def api(owner):
    client = APIClient()
    client.force_authenticate(owner)
    return client


def test_it_shows_the_sites_defaults_until_the_user_chooses(api, settings):
    settings.NOTIFY_DEFAULT_EVENTS = ["started"]
    body = api.get("/api/v1/me/notifications/").json()
    started = next(e for e in body["events"] if e["event"] == "started")
    queued = next(e for e in body["events"] if e["event"] == "queued")
    assert started["channels"]["email"] is True and started["chosen"] is False
    assert queued["channels"]["email"] is False
    assert "node_down" not in {e["event"] for e in body["events"]}  # admins' events


def test_it_stores_choices_and_addresses_through_the_api(api, owner):
    answer = api.put(
        "/api/v1/me/notifications/",
        {
            "preferences": {"started": {"email": False, "slack": True}},
            "contact": {"slack_user_id": "U1", "webhook_url": "https://hooks.example.org/x",
                        "webhook_secret": "s"},
        },
        format="json",
    )  # fmt: skip
    assert answer.status_code == 200, answer.content
    started = next(e for e in answer.json()["events"] if e["event"] == "started")
    assert started["channels"] == {"email": False, "slack": True, "webhook": True}
    assert answer.json()["contact"]["webhook_secret_set"] is True
    assert "webhook_secret" not in answer.json()["contact"]
    assert NotificationContact.objects.get(user=owner).slack_user_id == "U1"


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"preferences": {"lunch": {"email": True}}}, "preferences.lunch"),
        ({"preferences": {"started": {"pigeon": True}}}, "preferences.started.pigeon"),
        ({"contact": {"webhook_url": "not a url"}}, "contact"),
    ],
)
def test_it_refuses_unknown_events_channels_and_bad_urls(api, owner, body, field):
    answer = api.put("/api/v1/me/notifications/", body, format="json")
    assert answer.status_code == 400
    assert field in str(answer.json()["error"]["fields"])
    assert not NotificationPreference.objects.exists()


def test_it_saves_choices_from_the_settings_page(owner):
    client = Client()
    client.force_login(owner)
    page = client.get("/settings/notifications/")
    assert page.status_code == 200
    assert 'name="started:email" checked' in page.content.decode()
    saved = client.post("/settings/notifications/", {"failed:slack": "on", "slack_user_id": "U9"})
    assert saved.status_code == 302
    assert NotificationPreference.objects.get(user=owner, event="failed", channel="slack").enabled
    assert not NotificationPreference.objects.get(
        user=owner, event="started", channel="email"
    ).enabled


def test_it_lists_every_send_for_admins_by_status(owner):
    admin = UserFactory(username="root", is_staff=True, is_superuser=True)
    from django.utils import timezone

    note = Notification.objects.create(event="started", created=timezone.now())
    for status, key in (("sent", "a"), ("failed", "b")):
        Delivery.objects.create(
            notification=note, event="started", channel="slack", recipient=f"U-{key}",
            idempotency_key=key, status=status, created=timezone.now(), last_error="HTTP 500",
        )  # fmt: skip
    client = Client()
    client.force_login(admin)
    html = client.get("/admin/portal/delivery/?status__exact=failed").content.decode()
    assert "U-b" in html and "U-a" not in html


def test_it_documents_the_endpoint_in_the_openapi_schema(api):
    schema = api.get("/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json").json()
    assert set(schema["paths"]["/api/v1/me/notifications/"]) >= {"get", "put"}
