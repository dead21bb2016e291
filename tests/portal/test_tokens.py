"""API tokens: named, scoped read-only or read-write, optional expiry, shown once, revocable by
their owner and by admins, with their last use listed; each creation and revocation audited."""

import time
from datetime import timedelta

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from portal.models import ApiToken, AuditEvent
from portal.services.access.tokens import token_create
from tests.conftest import error_of
from tests.factories import UserFactory

pytestmark = pytest.mark.django_db


def _client(raw: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {raw}")
    return client


def test_it_refuses_writes_with_a_read_only_token_but_lets_it_read(user, project):
    raw, _ = token_create(user=user, now=timezone.now(), name="dash", scope="read")
    client = _client(raw)
    assert client.get("/api/v1/bookings/").status_code == 200
    response = client.post("/api/v1/bookings/", {"gpus": 1, "duration_s": 3600}, format="json")
    assert response.status_code == 403
    assert error_of(response)["code"] == "token_read_only"
    assert client.delete("/api/v1/auth/tokens/1/").status_code == 403
    assert not AuditEvent.objects.filter(action="booking.submit").exists()


def test_it_refuses_an_expired_token_with_401_even_while_it_is_cached(user, project):
    now = timezone.now()
    raw, _ = token_create(user=user, now=now, expires_at=now + timedelta(seconds=1))
    client = _client(raw)
    assert client.get("/api/v1/bookings/").status_code == 200  # now cached as valid
    time.sleep(1.1)
    response = client.get("/api/v1/bookings/")
    assert response.status_code == 401
    assert error_of(response)["code"] == "token_expired"


def test_it_refuses_an_expiry_in_the_past(user):
    client = APIClient()
    client.force_authenticate(user)
    past = (timezone.now() - timedelta(days=1)).isoformat()
    response = client.post("/api/v1/auth/tokens/", {"name": "x", "expires_at": past}, format="json")
    assert response.status_code == 400 and "expires_at" in error_of(response)["fields"]
    assert not ApiToken.objects.exists()


def test_it_creates_a_named_scoped_token_shown_once_and_lists_its_last_use(user, project):
    client = APIClient()
    client.force_authenticate(user)
    expires = timezone.now() + timedelta(days=30)
    body = client.post(
        "/api/v1/auth/tokens/",
        {"name": "grafana", "scope": "read", "expires_at": expires.isoformat()},
        format="json",
    ).json()
    assert body["token"].startswith("gp_") and body["scope"] == "read"
    _client(body["token"]).get("/api/v1/bookings/")
    listed = client.get("/api/v1/auth/tokens/").json()["results"]
    assert [(t["name"], t["scope"]) for t in listed] == [("grafana", "read")]
    assert "token" not in listed[0] and listed[0]["last_used"] is not None
    created = AuditEvent.objects.get(action="token.create")
    assert created.after["scope"] == "read" and created.after["name"] == "grafana"
    assert "key_hash" not in created.after


def test_it_keeps_the_password_exchange_working_for_the_cli(db):
    UserFactory(username="erin")
    response = APIClient().post(
        "/api/v1/auth/token/", {"username": "erin", "password": "pw-secret-123"}, format="json"
    )
    assert response.status_code == 201
    body = response.json()
    assert body["scope"] == "read-write" and body["expires_at"] is None
    created = _client(body["token"]).post("/api/v1/auth/tokens/", {"name": "second"}, format="json")
    assert created.status_code == 201


def test_it_updates_last_use_at_most_once_a_minute(user, project):
    raw, token = token_create(user=user, now=timezone.now())
    client = _client(raw)
    client.get("/api/v1/bookings/")
    first = ApiToken.objects.get(pk=token.pk).last_used
    client.get("/api/v1/bookings/")
    assert ApiToken.objects.get(pk=token.pk).last_used == first


def test_it_lets_the_owner_revoke_and_audits_it(user):
    raw, token = token_create(user=user, now=timezone.now(), name="old")
    client = _client(raw)
    assert client.delete(f"/api/v1/auth/tokens/{token.pk}/").status_code == 204
    assert client.get("/api/v1/bookings/").status_code == 401
    revoked = AuditEvent.objects.get(action="token.revoke")
    assert revoked.actor_id == user.pk and revoked.before["name"] == "old"


def test_it_lets_an_admin_revoke_anyones_token_in_the_admin(client, user):
    _, token = token_create(user=user, now=timezone.now(), name="leaked")
    admin = UserFactory(username="root", is_staff=True, is_superuser=True)
    client.force_login(admin)
    page = client.get("/admin/portal/apitoken/")
    assert "leaked" in page.content.decode()
    response = client.post(
        "/admin/portal/apitoken/", {"action": "revoke", "_selected_action": [token.pk]}
    )
    assert response.status_code == 302
    assert not ApiToken.objects.exists()
    revoked = AuditEvent.objects.get(action="token.revoke")
    assert (revoked.actor_name, revoked.via, revoked.before["user_id"]) == (
        "root",
        "admin",
        user.pk,
    )
