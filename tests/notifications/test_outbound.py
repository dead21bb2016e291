"""User-set destinations (webhooks, Slack incoming webhooks): https only, never loopback, a
private or link-local network unless the site allows it, no redirects; refused when set (400
naming the field) and, should the name resolve there later, at send time (failed, not retried)."""

import socket

import pytest
from django.db import transaction
from rest_framework.test import APIClient

from portal import outbound
from portal.models import Delivery, NotificationContact, ProjectNotificationSettings
from portal.services.notify.notifications import booking_event_record
from tests.factories import make_active_booking, make_node
from tests.notifications.conftest import Receiver

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def guarded(settings):
    """The site's defaults: https only, no network allowed."""
    settings.NOTIFY_ALLOW_HTTP = False
    settings.NOTIFY_ALLOWED_NETWORKS = []


@pytest.fixture
def api(owner):
    client = APIClient()
    client.force_authenticate(owner)
    return client


def _put(api, **contact):
    return api.put("/api/v1/me/notifications/", {"contact": contact}, format="json")


@pytest.mark.parametrize(
    "url",
    [
        "https://127.0.0.1:6379/internal-admin?delete=all",
        "https://localhost/",
        "https://[::ffff:127.0.0.1]/",
        "https://[::1]:5432/",
        "https://0.0.0.0/",
        "https://10.1.2.3/hook",
        "https://192.168.0.10/hook",
        "https://169.254.169.254/latest/meta-data/",
        "https://224.0.0.1/",
        "http://hooks.example.org/x",
        "ftp://127.0.0.1/",
    ],
)
@pytest.mark.parametrize("field", ["webhook_url", "slack_webhook_url"])
def test_it_refuses_a_destination_it_may_not_contact_when_it_is_set(api, owner, url, field):
    answer = _put(api, **{field: url})
    assert answer.status_code == 400, answer.content
    assert f"contact.{field}" in answer.json()["error"]["fields"]
    assert not NotificationContact.objects.filter(user=owner).exists()


def test_it_accepts_plain_http_only_when_the_site_allows_it(api, owner, settings):
    settings.NOTIFY_ALLOW_HTTP = True
    answer = _put(api, webhook_url="http://hooks.example.org/x")
    assert answer.status_code == 200, answer.content


def test_it_refuses_a_projects_destination_in_the_admin(admin_client, project):
    answer = admin_client.post(
        "/admin/portal/projectnotificationsettings/add/",
        {
            "project": project.pk,
            "webhook_url": "https://127.0.0.1/hook",
            "channel_events": "[]",
            "default_channels": "{}",
        },
    )
    assert answer.status_code == 200  # the form again, with the error
    assert "loopback" in answer.content.decode()
    assert not ProjectNotificationSettings.objects.exists()


@pytest.fixture
def started(owner, project):
    gpus = list(make_node("gpu-o", gpus=1).gpus.all())
    return make_active_booking(gpus, owner=owner, project=project)


def _record(booking, capture):
    with capture(execute=True), transaction.atomic():
        booking_event_record(booking_id=booking.pk, event="started")


def test_it_never_contacts_a_loopback_listener_and_does_not_retry(
    receiver, started, owner, settings, django_capture_on_commit_callbacks
):
    settings.NOTIFY_ALLOW_HTTP = True
    # Stored before the rule, or a name that resolved elsewhere when it was set.
    NotificationContact.objects.create(user=owner, webhook_url=f"{receiver.url}/internal-admin")
    _record(started, django_capture_on_commit_callbacks)
    delivery = Delivery.objects.get(channel="webhook")
    assert (delivery.status, delivery.attempts) == ("failed", 1)
    assert "loopback" in delivery.last_error
    assert receiver.arrivals == 0


def test_it_lets_a_site_allowed_internal_receiver_through(
    receiver, started, owner, settings, django_capture_on_commit_callbacks
):
    settings.NOTIFY_ALLOW_HTTP = True
    settings.NOTIFY_ALLOWED_NETWORKS = ["127.0.0.0/8"]
    NotificationContact.objects.create(user=owner, webhook_url=f"{receiver.url}/hook")
    _record(started, django_capture_on_commit_callbacks)
    assert [post["path"] for post in receiver.posts] == ["/hook"]
    assert Delivery.objects.get(channel="webhook").status == "sent"


def test_it_follows_no_redirect(
    receiver, started, owner, settings, django_capture_on_commit_callbacks
):
    settings.NOTIFY_ALLOW_HTTP = True
    settings.NOTIFY_ALLOWED_NETWORKS = ["127.0.0.1/32"]
    inner = Receiver()
    try:
        receiver.redirect_to = f"{inner.url}/internal"
        NotificationContact.objects.create(user=owner, slack_webhook_url=f"{receiver.url}/hook")
        _record(started, django_capture_on_commit_callbacks)
        assert receiver.arrivals == 1 and inner.arrivals == 0
        delivery = Delivery.objects.get(channel="slack")
        assert (delivery.status, delivery.attempts) == ("failed", 1)
        assert "redirect" in delivery.last_error
    finally:
        inner.close()


def test_it_resolves_names_at_send_time(monkeypatch, started, owner, settings,
                                        django_capture_on_commit_callbacks):  # fmt: skip
    real = socket.getaddrinfo

    def rebinding(host, *args, **kwargs):  # a public name that now points at loopback
        return real("127.0.0.1" if host == "hooks.example.org" else host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", rebinding)
    NotificationContact.objects.create(user=owner, webhook_url="https://hooks.example.org/x")
    _record(started, django_capture_on_commit_callbacks)
    delivery = Delivery.objects.get(channel="webhook")
    assert (delivery.status, delivery.attempts) == ("failed", 1)
    assert "loopback" in delivery.last_error


@pytest.mark.parametrize(
    ("address", "refused"),
    [
        ("8.8.8.8", ""),
        ("2606:4700::1111", ""),
        ("::ffff:8.8.8.8", ""),
        ("64:ff9b::808:808", ""),  # NAT64 of a public address (an IPv6-only site's DNS64)
        ("2002:7f00:1::", "6to4"),  # carries 127.0.0.1; ipaddress.is_global says global
        ("2002:808:808::1", "6to4"),  # a relay's address, whatever it carries
        ("fec0::1", "site-local"),  # deprecated, and global to ipaddress
        ("2001:0:4136:e378:8000:63bf:3fff:fdd2", "2001:0:4136:e378"),  # Teredo
        ("64:ff9b::7f00:1", "127.0.0.1 is a loopback"),
        ("64:ff9b::a00:1", "10.0.0.1 is a private"),
        ("64:ff9b:1::1", "64:ff9b:1::1"),
        ("::ffff:127.0.0.1", "127.0.0.1 is a loopback"),
        ("::ffff:169.254.169.254", "link-local"),
        ("::7f00:1", "::7f00:1"),  # IPv4-compatible (deprecated)
        ("::ffff:0:7f00:1", "::ffff:0:7f00:1"),  # IPv4-translated
        ("192.0.0.8", "192.0.0.8"),  # the IPv4 dummy address, global to ipaddress
        ("3fff::1", "documentation"),
        ("100.64.0.1", "not a public address"),  # carrier-grade NAT
        ("fe80::1%eth0", "link-local"),
        ("fd00::1", "private"),
        ("ff02::1", "multicast"),
        ("::", "unspecified"),
        ("255.255.255.255", "255.255.255.255"),
    ],
)
def test_it_judges_each_address_by_the_address_it_reaches(address, refused):
    problem = outbound.address_refused(address)
    assert (refused in problem and problem) if refused else problem == "", problem


def test_it_connects_only_to_the_address_it_checked(monkeypatch, receiver, settings):
    """DNS rebinding: the name is public when checked and loopback a moment later."""
    settings.NOTIFY_ALLOW_HTTP = True
    real = socket.getaddrinfo
    answers = []

    def rebinding(host, port, *args, **kwargs):
        if host != "hooks.example.org":
            return real(host, port, *args, **kwargs)
        answers.append("203.0.113.7" if not answers else "127.0.0.1")
        return real(answers[-1], port, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", rebinding)
    port = receiver.server.server_port
    # A TEST-NET address stands for the public one: allowed here, and nothing answers there.
    settings.NOTIFY_ALLOWED_NETWORKS = ["203.0.113.0/24"]
    with pytest.raises(outbound.DestinationUnreachable):
        outbound.destination_post(f"http://hooks.example.org:{port}/hook", b"{}", {}, timeout=0.5)
    assert answers[0] == "203.0.113.7"
    assert receiver.arrivals == 0
