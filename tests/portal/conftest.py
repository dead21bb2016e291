"""Fixtures of the portal's service and API tests."""

import pytest


@pytest.fixture
def submit(api, django_capture_on_commit_callbacks):
    """POST bookings/ with its after-commit effects run as a real commit would (the allocation
    pass may start it); the new booking's id."""

    def submit(**body) -> int:
        with django_capture_on_commit_callbacks(execute=True):
            response = api.post("/api/v1/bookings/", body, format="json")
        assert response.status_code == 201, response.json()
        return response.json()["id"]

    return submit
