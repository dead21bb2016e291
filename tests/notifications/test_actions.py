"""One-click actions from a message: a confirmation page, one POST, once; stale, reused or
expired links say so; Slack's buttons reach the same actions when Slack signed the request."""

import json
import time
from datetime import timedelta
from urllib.parse import urlencode

import pytest
from django.test import Client
from django.utils import timezone

from portal.models import ActionUse, Allocation, AuditEvent, Booking
from portal.services.notify.booking_links import action_token
from portal.services.notify.slack_requests import slack_signature
from tests.factories import make_active_booking, make_node

pytestmark = pytest.mark.django_db


@pytest.fixture
def booking(owner, project):
    return make_active_booking(
        list(make_node("gpu-a", gpus=1).gpus.all()), owner=owner, project=project
    )


def _end(booking):
    return max(a.end for a in Allocation.objects.filter(booking=booking, live=True))


def test_it_confirms_before_acting_and_acts_once(booking):
    client = Client(enforce_csrf_checks=True)
    url = f"/actions/{action_token(booking=booking, action='extend')}/"
    before = _end(booking)
    page = client.get(url)
    assert page.status_code == 200
    assert "Extend by an hour?" in page.content.decode()
    assert _end(booking) == before  # the GET (a mail scanner) changed nothing
    done = client.post(url, {"csrfmiddlewaretoken": page.cookies["csrftoken"].value})
    assert done.status_code == 200
    assert "Done: extend by an hour" in done.content.decode()
    assert _end(booking) == before + timedelta(hours=1)
    again = client.post(url, {"csrfmiddlewaretoken": page.cookies["csrftoken"].value})
    assert again.status_code in (409, 410)
    assert _end(booking) == before + timedelta(hours=1)


def test_it_refuses_a_reused_link(booking):
    client = Client()
    token = action_token(booking=booking, action="release")
    assert client.post(f"/actions/{token}/").status_code == 200
    assert Booking.objects.get(pk=booking.pk).state == "finished"
    reused = client.get(f"/actions/{token}/")
    assert reused.status_code == 410
    assert "already used" in reused.content.decode()


def test_it_refuses_an_expired_link(booking, settings):
    token = action_token(booking=booking, action="release")
    settings.NOTIFY_ACTION_TTL_S = 60
    from django.core import signing

    # A token signed two minutes ago (the signer's clock, not the test's, is what counts).
    signer = signing.TimestampSigner(salt="portal.booking-action")
    value = signer.unsign_object(token)
    old = signing.TimestampSigner(salt="portal.booking-action")
    old.timestamp = lambda: signing.b62_encode(int(time.time()) - 120)
    expired = old.sign_object(value, compress=True)
    page = Client().post(f"/actions/{expired}/")
    assert page.status_code == 410
    assert "expired" in page.content.decode()
    assert Booking.objects.get(pk=booking.pk).state == "active"


def test_it_refuses_a_link_to_a_booking_that_changed_since(booking):
    release = action_token(booking=booking, action="release")
    extend = action_token(booking=booking, action="extend")
    assert Client().post(f"/actions/{extend}/").status_code == 200
    page = Client().post(f"/actions/{release}/")
    assert page.status_code == 409
    assert "changed since" in page.content.decode()
    assert Booking.objects.get(pk=booking.pk).state == "active"


def test_it_refuses_a_forged_link(booking):
    token = action_token(booking=booking, action="release")
    page = Client().post(f"/actions/{token[:-3]}abc/")
    assert page.status_code == 400
    assert Booking.objects.get(pk=booking.pk).state == "active"
    assert not ActionUse.objects.exists()


def _slack_post(client, body: bytes, secret="slack-secret", age_s=0):
    timestamp = str(int(time.time()) - age_s)
    return client.post(
        "/slack/interactivity/",
        body,
        content_type="application/x-www-form-urlencoded",
        headers={
            "X-Slack-Request-Timestamp": timestamp,
            "X-Slack-Signature": slack_signature(secret=secret, timestamp=timestamp, body=body),
        },
    )


def _button(booking, action):
    payload = {
        "type": "block_actions",
        "actions": [{"action_id": action, "value": action_token(booking=booking, action=action)}],
    }
    return urlencode({"payload": json.dumps(payload)}).encode()


def test_it_acts_on_a_slack_button_that_slack_signed(booking, settings):
    settings.SLACK_SIGNING_SECRET = "slack-secret"
    client = Client()
    assert _slack_post(client, _button(booking, "release"), secret="wrong").status_code == 401
    assert _slack_post(client, _button(booking, "release"), age_s=600).status_code == 401
    assert Booking.objects.get(pk=booking.pk).state == "active"
    answer = _slack_post(client, _button(booking, "release"))
    assert answer.status_code == 200
    assert answer.json()["text"].startswith("Done: release now")
    assert Booking.objects.get(pk=booking.pk).state == "finished"


def test_it_keeps_an_idle_booking_from_the_link(booking):
    from portal.models import IdleReclaim

    IdleReclaim.objects.create(booking=booking, warned_at=timezone.now())
    token = action_token(booking=booking, action="keep")
    assert Client().post(f"/actions/{token}/").status_code == 200
    assert IdleReclaim.objects.get().state == "kept"


@pytest.mark.parametrize("timestamp", ["4" * 400, "9" * 5000, "²", "-1", "1e9", ""])
def test_it_answers_401_to_a_slack_request_with_a_malformed_timestamp(booking, settings, timestamp):
    settings.SLACK_SIGNING_SECRET = "slack-secret"
    body = _button(booking, "release")
    answer = Client().post(
        "/slack/interactivity/",
        body,
        content_type="application/x-www-form-urlencoded",
        headers={"X-Slack-Request-Timestamp": timestamp, "X-Slack-Signature": "v0=00"},
    )
    assert answer.status_code == 401
    assert Booking.objects.get(pk=booking.pk).state == "active"


def test_it_answers_401_to_a_slack_signature_that_is_not_ascii(booking, settings):
    settings.SLACK_SIGNING_SECRET = "slack-secret"
    answer = Client().post(
        "/slack/interactivity/",
        _button(booking, "release"),
        content_type="application/x-www-form-urlencoded",
        headers={"X-Slack-Request-Timestamp": str(int(time.time())), "X-Slack-Signature": "v0=é"},
    )
    assert answer.status_code == 401


def test_it_audits_a_link_action_as_via_link_with_the_clients_address(booking):
    client = Client()
    url = f"/actions/{action_token(booking=booking, action='cancel')}/"
    assert client.post(url, REMOTE_ADDR="198.51.100.23").status_code == 200
    (event,) = AuditEvent.objects.filter(action="booking.cancel")
    assert (event.via, event.address, event.actor_id) == ("link", "198.51.100.23", booking.owner_id)


def test_it_audits_a_slack_button_as_via_slack_with_the_clients_address(booking, settings):
    settings.SLACK_SIGNING_SECRET = "slack-secret"
    body = _button(booking, "release")
    timestamp = str(int(time.time()))
    answer = Client().post(
        "/slack/interactivity/",
        body,
        content_type="application/x-www-form-urlencoded",
        headers={
            "X-Slack-Request-Timestamp": timestamp,
            "X-Slack-Signature": slack_signature(
                secret="slack-secret", timestamp=timestamp, body=body
            ),
        },
        REMOTE_ADDR="203.0.113.9",
    )
    assert answer.status_code == 200
    (event,) = AuditEvent.objects.filter(action="booking.release")
    assert (event.via, event.address) == ("slack", "203.0.113.9")
