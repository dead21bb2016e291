"""Fixtures of the portal's service and API tests."""

import pytest


@pytest.fixture
def post_booking(api, django_capture_on_commit_callbacks):
    """POST bookings/ with its after-commit effects run as a real commit would (the allocation
    pass may start it); the response."""

    def post(**body):
        with django_capture_on_commit_callbacks(execute=True):
            return api.post("/api/v1/bookings/", body, format="json")

    return post


@pytest.fixture
def submit(post_booking):
    """POST bookings/ as ``post_booking`` does; the new booking's id."""

    def submit(**body) -> int:
        response = post_booking(**body)
        assert response.status_code == 201, response.json()
        return response.json()["id"]

    return submit
