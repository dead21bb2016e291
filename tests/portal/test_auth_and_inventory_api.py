"""Tokens, inventory listings, my quota, the OpenAPI schema and docs."""

from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from rest_framework.test import APIClient

from portal.models import ApiToken
from tests.conftest import error_of
from tests.factories import AllocationFactory, BookingFactory, UserFactory, make_mig_gpu, make_node

pytestmark = pytest.mark.django_db


@pytest.fixture
def anon():
    return APIClient()


def _login(anon, password="pw-secret-123", **extra):
    UserFactory(username="alice")
    return anon.post(
        "/api/v1/auth/token/", {"username": "alice", "password": password, **extra}, format="json"
    )


def test_it_issues_a_token_that_authenticates_scripts(anon, project):
    response = _login(anon, name="laptop")
    assert response.status_code == 201
    token = response.json()["token"]
    assert ApiToken.objects.get().key_hash != token  # stored hashed
    anon.credentials(HTTP_AUTHORIZATION=f"Token {token}")
    assert anon.get("/api/v1/bookings/").status_code == 200


def test_it_refuses_a_wrong_password_naming_the_field(anon):
    response = _login(anon, password="nope")
    assert response.status_code == 400
    assert "password" in error_of(response)["fields"]
    assert not ApiToken.objects.exists()


def test_it_lists_and_revokes_my_tokens(anon, project):
    token = _login(anon, name="ci").json()
    anon.credentials(HTTP_AUTHORIZATION=f"Token {token['token']}")
    listed = anon.get("/api/v1/auth/tokens/").json()["results"]
    assert [t["name"] for t in listed] == ["ci"] and "key_hash" not in listed[0]
    assert anon.delete(f"/api/v1/auth/tokens/{token['id']}/").status_code == 204
    response = anon.get("/api/v1/bookings/")
    assert response.status_code == 401
    assert "revoked" in error_of(response)["message"]


def test_it_does_not_let_me_revoke_someone_elses_token(anon, project):
    other = UserFactory(username="bob")
    theirs = ApiToken.objects.create(user=other, key_hash="x" * 64, prefix="gp_x")
    token = _login(anon).json()["token"]
    anon.credentials(HTTP_AUTHORIZATION=f"Token {token}")
    assert anon.delete(f"/api/v1/auth/tokens/{theirs.id}/").status_code == 404
    assert ApiToken.objects.filter(pk=theirs.pk).exists()


def test_it_lists_gpus_with_filters_and_pagination(api, db):
    make_node("node-a", gpus=8, model="H100-80GB")
    node = make_node("node-b", gpus=2)
    make_mig_gpu(node, 2)
    response = api.get("/api/v1/gpus/", {"model": "H100-80GB", "page_size": 5})
    body = response.json()
    assert body["count"] == 8 and len(body["results"]) == 5 and body["next"]
    assert {g["node"] for g in body["results"]} == {"node-a"}
    migs = api.get("/api/v1/mig-instances/", {"node": "node-b"}).json()
    assert sorted(m["profile"] for m in migs["results"]) == [
        "1g.10gb",
        "1g.10gb",
        "2g.20gb",
        "3g.40gb",
    ]
    nodes = api.get("/api/v1/nodes/", {"state": "up"}).json()["results"]
    assert [(n["hostname"], n["gpu_count"]) for n in nodes] == [("node-a", 8), ("node-b", 3)]


def test_it_filters_devices_free_now(api, db):
    node = make_node("node-a", gpus=3)
    make_mig_gpu(node, 3)
    make_node("node-down", gpus=1, state="down")
    gpu0, gpu1 = node.gpus.filter(index__in=[0, 1]).order_by("index")
    held_mig = gpu0.node.gpus.get(index=3).mig_instances.get(profile="2g.20gb")
    now = timezone.now()
    AllocationFactory(gpu=gpu0, start=now - timedelta(minutes=5))
    AllocationFactory(gpu=held_mig.gpu, mig_instance=held_mig, fraction=held_mig.fraction)
    AllocationFactory(gpu=gpu1, start=now + timedelta(hours=2))  # later: free now
    AllocationFactory(gpu=gpu1, start=now - timedelta(hours=2), live=False)  # ended

    def names(path, free):
        rows = api.get(path, {"free": free}).json()["results"]
        return sorted(f"{r['node']}/{r.get('index', r.get('profile'))}" for r in rows)

    assert names("/api/v1/gpus/", "true") == ["node-a/1", "node-a/2"]
    assert names("/api/v1/gpus/", "false") == ["node-a/0", "node-a/3", "node-down/0"]
    assert names("/api/v1/mig-instances/", "true") == [
        "node-a/1g.10gb",
        "node-a/1g.10gb",
        "node-a/3g.40gb",
    ]
    assert names("/api/v1/mig-instances/", "false") == ["node-a/2g.20gb"]


def test_it_lists_gpus_in_a_fixed_number_of_queries(api, db):
    for i in range(6):
        node = make_node(f"n{i}", gpus=4)
        make_mig_gpu(node, 4)
    with CaptureQueriesContext(connection) as queries:
        assert api.get("/api/v1/gpus/", {"page_size": 100}).status_code == 200
    assert len(queries) <= 4


def test_it_lists_bookings_in_a_fixed_number_of_queries(api, user, project, db):
    node = make_node("n1", gpus=8)
    for gpu in node.gpus.all():
        AllocationFactory(booking=BookingFactory(owner=user, project=project), gpu=gpu)
    with CaptureQueriesContext(connection) as queries:
        assert api.get("/api/v1/bookings/").json()["count"] == 8
    assert len(queries) <= 5


def test_it_shows_my_quota_and_usage(api, user, project, db):
    project.quotas.update(max_gpus=8, gpu_hours_budget=100)
    gpu = make_node("n1", gpus=1).gpus.get()
    now = timezone.now()
    booking = BookingFactory(owner=user, project=project, state="active")
    AllocationFactory(
        booking=booking, gpu=gpu, start=now - timedelta(hours=2), end=now + timedelta(hours=1)
    )
    body = api.get("/api/v1/me/quota/").json()["results"]
    assert body[0]["project"] == "vision"
    assert body[0]["limits"]["max_gpus"] == 8 and body[0]["limits"]["gpu_hours_budget"] == 100
    assert body[0]["usage"]["gpus_in_use"] == 1.0
    assert body[0]["usage"]["gpu_hours_used"] == pytest.approx(2.0, abs=0.01)


def test_it_applies_a_user_override_field_by_field(api, user, project, db):
    from tests.factories import QuotaFactory

    project.quotas.update(max_gpus=8, max_duration_s=3600)
    QuotaFactory(project=project, user=user, max_gpus=2)
    limits = api.get("/api/v1/me/quota/").json()["results"][0]["limits"]
    assert limits["max_gpus"] == 2 and limits["max_duration_s"] == 3600


def test_it_serves_the_openapi_schema_and_local_docs(api):
    schema = api.get("/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json")
    assert schema.status_code == 200
    paths = schema.json()["paths"]
    assert "/api/v1/bookings/{id}/cancel/" in paths and "/api/v1/me/quota/" in paths
    docs = api.get("/api/docs/")
    assert docs.status_code == 200
    html = docs.content.decode()
    assert "/static/drf_spectacular_sidecar/" in html and "cdn." not in html


def _token(client, username, password, **headers):
    return client.post(
        "/api/v1/auth/token/",
        {"username": username, "password": password},
        format="json",
        **headers,
    )


def test_it_throttles_wrong_passwords_however_x_forwarded_for_changes(anon, settings):
    settings.LOGIN_FAILURE_LIMIT = 5
    UserFactory(username="alice")
    responses = [
        _token(anon, "alice", "nope", HTTP_X_FORWARDED_FOR=f"10.0.0.{i}") for i in range(30)
    ]
    assert [r.status_code for r in responses] == [400] * 5 + [429] * 25
    assert "Too many login attempts; try again in" in error_of(responses[5])["message"]
    assert int(responses[5]["Retry-After"]) > 0
    response = _token(anon, "alice", "pw-secret-123", HTTP_X_FORWARDED_FOR="10.9.9.9")
    assert response.status_code == 429
    assert error_of(response)["code"] == "throttled"
    assert not ApiToken.objects.exists()


def test_it_keys_on_the_trusted_proxys_address_and_on_the_username(anon, settings):
    settings.TRUSTED_PROXY_COUNT = 1
    settings.LOGIN_FAILURE_LIMIT = 3
    UserFactory(username="alice")
    UserFactory(username="bob")
    first = {"HTTP_X_FORWARDED_FOR": "6.6.6.6, 10.0.0.1"}
    second = {"HTTP_X_FORWARDED_FOR": "6.6.6.6, 10.0.0.2"}
    assert [_token(anon, "alice", "nope", **first).status_code for _ in range(3)] == [400] * 3
    assert _token(anon, "bob", "nope", **first).status_code == 429  # the address bucket is full
    assert _token(anon, "bob", "nope", **second).status_code == 400  # another address's is not
    response = _token(anon, "ALICE", "pw-secret-123", **second)  # the username's bucket is full
    assert response.status_code == 429
    assert "Too many login attempts" in error_of(response)["message"]
    assert _token(anon, "bob", "pw-secret-123", **second).status_code == 201


@pytest.mark.parametrize(
    ("url", "staff"), [("/accounts/login/", False), ("/admin/login/", True)], ids=["page", "admin"]
)
def test_it_throttles_the_login_forms(client, settings, url, staff):
    settings.LOGIN_FAILURE_LIMIT = 3
    UserFactory(username="alice", is_staff=staff, is_superuser=staff)
    for _ in range(3):
        response = client.post(url, {"username": "alice", "password": "nope"})
        assert response.status_code == 200
    response = client.post(url, {"username": "alice", "password": "pw-secret-123"})
    assert response.status_code == 429
    assert b"Too many login attempts; try again in" in response.content
    assert "_auth_user_id" not in client.session
