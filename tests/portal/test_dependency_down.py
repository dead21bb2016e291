"""With Redis not answering, requests answer 503 + Retry-After (never 500) and recover after."""

import pytest
from django.test import Client
from rest_framework.test import APIClient

from tests.conftest import error_of

pytestmark = pytest.mark.django_db

NO_REDIS = "redis://127.0.0.1:1/0"  # nothing listens on port 1: Redis refused, as when stopped


@pytest.fixture
def redis_down(settings):
    cache = dict(settings.CACHES["default"])
    settings.CACHES = {"default": {**cache, "LOCATION": NO_REDIS}}
    yield
    settings.CACHES = {"default": cache}


def test_it_answers_503_to_a_token_request_while_redis_is_down(user, redis_down):
    user.set_password("right-horse-battery")
    user.save()
    response = APIClient().post(
        "/api/v1/auth/token/",
        {"username": "alice", "password": "right-horse-battery"},
        format="json",
    )
    assert response.status_code == 503
    assert response["Retry-After"] == "5"
    assert error_of(response)["code"] == "busy"


def test_it_answers_a_busy_page_while_redis_is_down_and_recovers(user, project, cluster, settings):
    client = Client()
    client.force_login(user)
    cache = dict(settings.CACHES["default"])
    settings.CACHES = {"default": {**cache, "LOCATION": NO_REDIS}}
    down = client.get("/")
    assert down.status_code == 503
    assert down["Retry-After"] == "5"
    assert b"retry in a few seconds" in down.content.lower()
    settings.CACHES = {"default": cache}
    assert client.get("/").status_code == 200


def test_it_submits_an_idempotent_booking_once_while_redis_is_down(
    api, project, cluster, redis_down
):
    from portal.models import Booking

    def submit():
        body = {"gpus": 1, "duration_s": 3600}
        return api.post("/api/v1/bookings/", body, format="json", HTTP_IDEMPOTENCY_KEY="sweep-17")

    # The key is kept with the booking in PostgreSQL: Redis being down does not lose it.
    first, again = submit(), submit()
    assert (first.status_code, again.status_code) == (201, 200)
    assert again.json()["id"] == first.json()["id"]
    assert Booking.objects.count() == 1


def test_it_answers_503_to_an_estimate_while_redis_is_down(api, project, cluster, redis_down):
    response = api.post("/api/v1/bookings/estimate/", {"gpus": 1, "duration_s": 60}, format="json")
    assert response.status_code == 503
    assert error_of(response)["code"] == "busy" and response["Retry-After"]
