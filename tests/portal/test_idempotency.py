"""POST bookings/ with an Idempotency-Key: one booking per key, kept with the booking itself."""

import threading
import time
from datetime import timedelta

import pytest
from django.core.cache import cache
from django.db import connection, transaction
from django.utils import timezone

from portal.models import Booking
from portal.services.booking.booking_rules import check_request
from portal.services.booking.bookings import booking_from_request
from portal.services.booking.idempotency import booking_submit_once, request_digest
from tests.conftest import error_of
from tests.factories import UserFactory, member

pytestmark = pytest.mark.django_db


def _post(api, body, key):
    return api.post("/api/v1/bookings/", body, format="json", HTTP_IDEMPOTENCY_KEY=key)


def _window_body():
    start = timezone.now() + timedelta(hours=1)
    return {"gpus": 1, "start": start.isoformat(), "end": (start + timedelta(hours=2)).isoformat()}


def test_it_returns_the_first_booking_for_a_repeated_idempotency_key(api, project, cluster):
    body = _window_body()
    first = _post(api, body, "abc-1")
    again = _post(api, body, "abc-1")
    assert first.status_code == 201 and again.status_code == 200
    assert again.json()["id"] == first.json()["id"]
    assert Booking.objects.count() == 1
    other = _post(api, body, "abc-2")
    assert other.status_code == 201 and Booking.objects.count() == 2


def test_it_takes_the_same_request_spelled_differently_as_a_retry(api, project, cluster):
    start = (timezone.now() + timedelta(hours=1)).replace(microsecond=0)
    end = start + timedelta(hours=2)
    first = _post(api, {"gpus": 1, "start": start.isoformat(), "end": end.isoformat()}, "k")
    paris = timezone.get_fixed_timezone(60)
    again = _post(
        api,
        {
            "end": end.astimezone(paris).isoformat(),
            "start": start.astimezone(paris).isoformat(),
            "gpus": 1,
            "qos": "normal",  # the default, now spelled out
        },
        "k",
    )
    assert again.status_code == 200, again.json()
    assert again.json()["id"] == first.json()["id"]


def test_it_refuses_a_key_reused_with_a_different_body_with_422(api, project, cluster):
    first = _post(api, {"gpus": 1, "duration_s": 3600}, "job-7")
    assert first.status_code == 201
    response = _post(api, {"gpus": 2, "duration_s": 3600}, "job-7")
    assert response.status_code == 422, response.json()
    error = error_of(response)
    assert error["code"] == "idempotency_key_reused"
    assert "Idempotency-Key" in error["fields"] and str(first.json()["id"]) in error["message"]
    assert Booking.objects.count() == 1


def test_it_keeps_the_key_with_the_booking_not_in_the_cache(api, project, cluster):
    body = {"gpus": 1, "duration_s": 3600}
    first = _post(api, body, "k-1")
    assert Booking.objects.get().idempotency_key == "k-1"
    cache.clear()  # a Redis restart or eviction forgets nothing
    again = _post(api, body, "k-1")
    assert again.status_code == 200 and again.json()["id"] == first.json()["id"]
    assert Booking.objects.count() == 1


def test_it_scopes_keys_to_their_owner(api, project, cluster):
    body = {"gpus": 1, "duration_s": 3600}
    assert _post(api, body, "same").status_code == 201
    other = UserFactory(username="bob")
    member(other, project)
    api.force_authenticate(other)
    response = _post(api, body, "same")
    assert response.status_code == 201 and response.json()["owner"] == "bob"


def test_it_forgets_an_idempotency_key_whose_request_failed(api, project, cluster):
    refused = _post(api, {"gpus": 17, "duration_s": 3600}, "k")  # more than the cluster has
    assert refused.status_code == 409
    assert _post(api, {"gpus": 1, "duration_s": 3600}, "k").status_code == 201


def test_it_refuses_a_key_longer_than_it_can_store(api, project, cluster):
    response = _post(api, {"gpus": 1, "duration_s": 3600}, "x" * 201)
    assert response.status_code == 400
    assert "Idempotency-Key" in error_of(response)["fields"]
    assert not Booking.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_it_answers_a_racing_retry_with_the_booking_that_won(user, project, cluster):
    """The second request checks the key before the first commits; the unique constraint makes
    its insert wait, then fail, and it answers with the first's booking."""
    fields = {"gpus": 1, "duration_s": 3600}
    digest = request_digest(fields)
    inserted, done = threading.Event(), {}

    def first():
        try:
            with transaction.atomic():
                request = check_request(
                    user=user,
                    now=timezone.now(),
                    **{**dict.fromkeys(("project", "mig_profile", "gpu_model")), **fields},
                    start=None,
                    end=None,
                    qos="normal",
                    preemptible=False,
                    command="",
                )
                booking = booking_from_request(user, request, timezone.now())
                booking.idempotency_key, booking.request_digest = "race", digest
                booking.save()
                done["first"] = booking.pk
                inserted.set()
                time.sleep(0.5)  # the second request runs meanwhile and waits on the key
        finally:
            connection.close()

    thread = threading.Thread(target=first)
    thread.start()
    assert inserted.wait(10)
    booking, created = booking_submit_once(user=user, now=timezone.now(), key="race", **fields)
    thread.join()
    assert created is False and booking.pk == done["first"]
    assert Booking.objects.count() == 1
