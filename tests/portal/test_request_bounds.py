"""One table of request bounds: the API and the Book form refuse the same request at the same
bound, the site's settings move it, and the agent protocol's constants agree with it."""

import pytest
from django.test import override_settings
from django.utils import timezone

from agents import protocol
from portal.errors import ValidationFailed
from portal.models import Booking, Gpu, MigInstance
from portal.services.booking.booking_bounds import request_bounds
from portal.services.booking.bookings import booking_submit
from portal.web.forms import BookForm
from tests.conftest import error_of

pytestmark = pytest.mark.django_db


def _api(api, **fields):
    body = {"gpus": 1, "duration_s": 3600, **fields}
    return api.post("/api/v1/bookings/", body, format="json")


def _form(**fields):
    data = {"project": "vision", "kind": "gpus", "gpus": 1, "when": "asap", "duration_hours": 1}
    data |= {"qos": "normal", **fields}
    form = BookForm(data, projects=["vision"])
    form.is_valid()
    return form.errors


@pytest.mark.parametrize(
    ("api_field", "api_value", "form_field", "form_value"),
    [
        ("gpus", 9, "gpus", 9),
        ("gpus", 0, "gpus", 0),
        ("duration_s", 7201, "duration_hours", 2.01),
        ("command", "x" * 10_001, "command", "x" * 10_001),
    ],
)
@override_settings(BOOKING_MAX_GPUS_PER_REQUEST=8, BOOKING_MAX_DURATION_S=7200)
def test_it_refuses_an_out_of_bound_request_in_the_api_and_the_form(
    api, project, cluster, api_field, api_value, form_field, form_value
):
    response = _api(api, **{api_field: api_value})

    assert response.status_code == 400, response.json()
    assert api_field in error_of(response)["fields"]
    assert form_field in _form(**{form_field: form_value})
    assert Booking.objects.count() == 0


@override_settings(BOOKING_MAX_GPUS_PER_REQUEST=8, BOOKING_MAX_DURATION_S=7200)
def test_it_takes_a_request_at_the_bounds(api, project, cluster):
    assert _form(gpus=8, duration_hours=2, command="x" * 10_000) == {}
    response = _api(api, gpus=8, duration_s=7200, command="x" * 10_000)
    assert response.status_code == 201, response.json()


@override_settings(BOOKING_MAX_GPUS_PER_REQUEST=8)
def test_it_states_the_same_bound_in_the_api_and_the_form(api, project, cluster):
    api_message = " ".join(error_of(_api(api, gpus=9))["fields"]["gpus"])
    form_message = " ".join(_form(gpus=9)["gpus"])
    assert "8" in api_message and "8" in form_message


def test_it_keeps_the_protocol_bounds_equal_to_the_table():
    bounds = request_bounds()
    assert protocol.PROFILE_MAX == bounds.profile_max
    assert protocol.MODEL_MAX == bounds.model_max
    assert bounds.profile_max == MigInstance._meta.get_field("profile").max_length
    assert bounds.profile_max == Booking._meta.get_field("mig_profile").max_length
    assert bounds.model_max == Gpu._meta.get_field("model").max_length
    assert bounds.model_max == Booking._meta.get_field("gpu_model").max_length
    # The wire carries any command a request may hold.
    assert protocol.COMMAND_MAX >= bounds.command_max


def test_it_keeps_the_job_environment_bounds_equal_on_the_wire():
    from portal.services.booking import booking_bounds

    assert protocol.WORKDIR_MAX == booking_bounds.WORKDIR_MAX
    assert booking_bounds.WORKDIR_MAX == Booking._meta.get_field("workdir").max_length
    assert protocol.ENV_NAME_MAX == booking_bounds.ENV_NAME_MAX
    assert protocol.ENV_VALUE_MAX == booking_bounds.ENV_VALUE_MAX


@override_settings(BOOKING_MAX_GPUS_PER_REQUEST=8)
def test_it_refuses_too_many_gpus_in_the_service_too(user, project, cluster):
    with pytest.raises(ValidationFailed) as refused:
        booking_submit(user=user, now=timezone.now(), gpus=9, duration_s=3600)
    assert "gpus" in refused.value.fields
    assert Booking.objects.count() == 0
