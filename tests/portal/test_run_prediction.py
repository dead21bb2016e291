"""Run-time prediction in the portal: planned starts from the user's recent finished bookings."""

from datetime import datetime, timedelta

import pytest
from django.utils import timezone

from portal.models import Booking
from portal.services.booking.bookings import booking_release

pytestmark = pytest.mark.django_db


def _submit(api, commits, **body):
    with commits(execute=True):
        response = api.post("/api/v1/bookings/", body, format="json")
    assert response.status_code == 201, response.json()
    return response.json()


def _planned_start(api, booking_id) -> datetime:
    return datetime.fromisoformat(
        api.get(f"/api/v1/bookings/{booking_id}/").json()["planned_start"]
    )


@pytest.mark.parametrize("predict_last", [0, 2])
def test_it_plans_with_the_users_recent_run_times_when_prediction_is_on(
    api, user, project, cluster, settings, django_capture_on_commit_callbacks, predict_last
):
    settings.SCHEDULER_POLICY = {"predict_last": predict_last}
    project.quotas.update(max_gpus=None)
    now = timezone.now()
    for _ in range(2):  # two earlier bookings of 16 GPUs that ran 10 minutes each
        done = _submit(api, django_capture_on_commit_callbacks, gpus=16, duration_s=7200)
        booking_release(user=user, booking_id=done["id"], now=now)
        Booking.objects.filter(pk=done["id"]).update(
            started_at=now - timedelta(minutes=20), ended_at=now - timedelta(minutes=10)
        )
    hog = _submit(api, django_capture_on_commit_callbacks, gpus=16, duration_s=7200)
    waiting = _submit(api, django_capture_on_commit_callbacks, gpus=4, duration_s=600)
    started = datetime.fromisoformat(api.get(f"/api/v1/bookings/{hog['id']}/").json()["started_at"])
    expected = timedelta(minutes=10) if predict_last else timedelta(hours=2)
    assert abs(_planned_start(api, waiting["id"]) - (started + expected)) < timedelta(seconds=5)
