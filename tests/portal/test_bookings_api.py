"""The booking API: what a script submitting, listing and changing bookings sees."""

from datetime import timedelta

import pytest
from django.utils import timezone

from portal.models import Allocation, Booking, DomainEvent, Membership
from tests.conftest import error_of
from tests.factories import (
    GpuFactory,
    UserFactory,
    make_active_booking,
    make_mig_gpu,
    make_node,
    member,
)

pytestmark = pytest.mark.django_db


def _window(hours_from_now=1, hours=2):
    start = timezone.now() + timedelta(hours=hours_from_now)
    return start.isoformat(), (start + timedelta(hours=hours)).isoformat()


def _reserve(api, **fields):
    start, end = _window()
    body = {"gpus": 1, "start": start, "end": end, **fields}
    body = {k: v for k, v in body.items() if v is not None}
    return api.post("/api/v1/bookings/", body, format="json")


def test_it_places_a_reservation_on_free_gpus_of_one_node(api, project, cluster):
    response = _reserve(api, gpus=4)
    assert response.status_code == 201, response.json()
    body = response.json()
    assert body["state"] == "planned"
    assert body["project"] == "vision"
    assert len(body["devices"]) == 4
    assert len({d["node"] for d in body["devices"]}) == 1
    assert body["cuda_visible_devices"].count(",") == 3


def test_it_packs_a_second_reservation_onto_the_same_node(api, project, cluster):
    first = _reserve(api, gpus=4).json()
    second = _reserve(api, gpus=2).json()
    assert {d["node"] for d in first["devices"]} == {d["node"] for d in second["devices"]}


def test_it_takes_whole_nodes_for_requests_larger_than_a_node(api, project, cluster):
    body = _reserve(api, gpus=12).json()
    nodes = [d["node"] for d in body["devices"]]
    assert len(nodes) == 12 and nodes.count("node-a") + nodes.count("node-b") == 12
    assert max(nodes.count("node-a"), nodes.count("node-b")) == 8


def test_it_refuses_a_reservation_with_no_free_devices_with_409(api, project, cluster):
    project.quotas.update(max_gpus=None)
    assert _reserve(api, gpus=16).status_code == 201
    response = _reserve(api, gpus=1)
    assert response.status_code == 409
    error = error_of(response)
    assert error["code"] == "no_capacity"
    assert "free for the whole window" in error["message"]
    assert Booking.objects.count() == 1


def test_it_places_a_mig_reservation_on_a_matching_slice(api, project, db):
    node = make_node("mig-node", gpus=0)
    make_mig_gpu(node, 0)
    response = _reserve(api, gpus=None, mig_profile="2g.20gb")
    assert response.status_code == 201, response.json()
    assert response.json()["devices"][0]["device"] == "mig-node/gpu0/2g.20gb@3"
    assert Allocation.objects.get().fraction == pytest.approx(2 / 7)


def test_it_queues_an_asap_request_as_pending(api, project, cluster):
    response = api.post("/api/v1/bookings/", {"gpus": 2, "duration_s": 3600}, format="json")
    assert response.status_code == 201
    assert response.json()["state"] == "pending"
    assert response.json()["devices"] == []


@pytest.mark.parametrize(
    ("body", "field", "reason"),
    [
        ({"gpus": 0, "duration_s": 3600}, "gpus", "greater than or equal to 1"),
        ({"gpus": -3, "duration_s": 3600}, "gpus", "greater than or equal to 1"),
        ({"gpus": 10**30, "duration_s": 3600}, "gpus", "less than or equal to"),
        ({"gpus": "two", "duration_s": 3600}, "gpus", "valid integer"),
        ({"gpus": 1, "duration_s": 3600, "gpu_model": "Z9000"}, "gpu_model", "unknown GPU model"),
        ({"mig_profile": "9g.99gb", "duration_s": 3600}, "mig_profile", "unknown MIG profile"),
        ({"gpus": 1, "mig_profile": "1g.10gb", "duration_s": 3600}, "gpus", "not both"),
        ({"duration_s": 3600}, "gpus", "required"),
        ({"gpus": 1}, "duration_s", "required"),
        ({"gpus": 1, "duration_s": 10**12}, "duration_s", "less than or equal to"),
        ({"gpus": 1, "duration_s": 3600, "qos": "platinum"}, "qos", "not a valid choice"),
        ({"gpus": 1, "duration_s": 3600, "colour": "blue"}, "colour", "Unknown field"),
        ({"gpus": 1, "duration_s": 3600, "project": "nope"}, "project", "not one of your projects"),
        (
            {"gpus": 1, "start": "yesterday", "end": "2030-01-01T00:00:00Z"},
            "start",
            "Datetime has wrong format",
        ),
        ({"gpus": 1, "start": "2030-01-01T10:00:00Z"}, "end", "needs both"),
        (
            {"gpus": 1, "start": "2030-01-01T10:00:00Z", "end": "2030-01-01T09:00:00Z"},
            "end",
            "after start",
        ),
        (
            {"gpus": 1, "start": "2020-01-01T10:00:00Z", "end": "2020-01-01T11:00:00Z"},
            "start",
            "in the past",
        ),
        (
            {
                "gpus": 1,
                "duration_s": 3600,
                "start": "2030-01-01T10:00:00Z",
                "end": "2030-01-01T11:00:00Z",
            },
            "duration_s",
            "not both",
        ),
    ],
)
def test_it_rejects_bad_input_naming_the_field(api, project, cluster, body, field, reason):
    body = {k: v for k, v in body.items() if v is not None}
    response = api.post("/api/v1/bookings/", body, format="json")
    assert response.status_code == 400, response.json()
    error = error_of(response)
    assert field in error["fields"], error
    assert reason in error["fields"][field], error
    assert Booking.objects.count() == 0 and Allocation.objects.count() == 0


@pytest.fixture
def mixed(db):
    """node-a: 8 A100-80GB; node-b: 4 A100-80GB and 4 H100 (not a whole node of either)."""
    make_node("node-a")
    node_b = make_node("node-b", gpus=4)
    for index in range(4, 8):
        GpuFactory(node=node_b, index=index, model="H100")


@pytest.mark.parametrize(("gpus", "status"), [(8, 201), (10, 409), (12, 409)])
def test_it_refuses_a_queued_booking_no_node_set_could_ever_hold(api, project, mixed, gpus, status):
    body = {"gpus": gpus, "gpu_model": "A100-80GB", "duration_s": 3600}
    response = api.post("/api/v1/bookings/", body, format="json")
    assert response.status_code == status, response.json()
    if status == 409:
        error = error_of(response)
        assert error["code"] == "no_capacity"
        assert "the cluster has 8 A100-80GB GPUs for one queued booking" in error["fields"]["gpus"]
        assert not Booking.objects.exists()


@pytest.mark.parametrize(("gpus", "status"), [(12, 201), (13, 409)])
def test_it_admits_a_reservation_by_the_reservation_rules(api, project, mixed, gpus, status):
    response = _reserve(api, gpus=gpus, gpu_model="A100-80GB")
    assert response.status_code == status, response.json()
    if status == 409:
        error = error_of(response)
        assert error["code"] == "no_capacity"
        assert "the cluster has 12 A100-80GB GPUs" in error["fields"]["gpus"]


def test_it_refuses_an_asap_request_larger_than_the_cluster_with_409_no_capacity(
    api, project, cluster
):
    response = api.post("/api/v1/bookings/", {"gpus": 17, "duration_s": 3600}, format="json")
    assert response.status_code == 409, response.json()
    error = error_of(response)
    assert error["code"] == "no_capacity" and "cluster has 16" in error["fields"]["gpus"]
    assert not Booking.objects.exists()


def test_it_refuses_a_window_that_ended_within_the_past_slack(api, project, cluster):
    now = timezone.now()
    body = {"gpus": 1, "start": (now - timedelta(seconds=40)).isoformat()}
    body["end"] = (now - timedelta(seconds=20)).isoformat()
    response = api.post("/api/v1/bookings/", body, format="json")
    assert response.status_code == 400, response.json()
    assert "positive duration" in error_of(response)["fields"]["end"]
    assert not Booking.objects.exists()


def test_it_rejects_malformed_json_with_400(api, project, cluster):
    response = api.post("/api/v1/bookings/", '{"gpus": 1,', content_type="application/json")
    assert response.status_code == 400
    assert error_of(response)["code"] == "parse_error"


def test_it_rejects_a_json_array_body(api, project, cluster):
    response = api.post("/api/v1/bookings/", [1, 2], format="json")
    assert response.status_code == 400
    assert "non_field_errors" in error_of(response)["fields"]


def test_it_refuses_a_duration_over_the_quota_maximum(api, project, cluster):
    project.quotas.update(max_duration_s=7200)
    response = api.post("/api/v1/bookings/", {"gpus": 1, "duration_s": 7201}, format="json")
    assert response.status_code == 409
    error = error_of(response)
    assert error["code"] == "quota" and error["limit"] == "max_duration_s"
    assert "at most 7200 s" in error["fields"]["duration_s"]
    assert not Booking.objects.exists()


def test_it_refuses_a_request_larger_than_the_quota_ever_allows(api, project, cluster):
    project.quotas.update(max_gpus=4)
    response = api.post("/api/v1/bookings/", {"gpus": 5, "duration_s": 3600}, format="json")
    assert response.status_code == 409
    error = error_of(response)
    assert error["code"] == "quota" and error["limit"] == "max_gpus"
    assert error["limit_value"] == 4.0 and error["asks"] == 5.0
    assert "quota allows 4 at once" in error["fields"]["gpus"]
    assert not Booking.objects.exists()


def test_it_refuses_a_reservation_over_the_concurrent_quota_with_usage(api, project, cluster):
    project.quotas.update(max_gpus=6)
    assert _reserve(api, gpus=4).status_code == 201
    response = _reserve(api, gpus=4)
    assert response.status_code == 409
    error = error_of(response)
    assert error["code"] == "quota"
    assert error["limit"] == "max_gpus" and error["usage"] == 4.0 and error["limit_value"] == 6.0
    assert Booking.objects.count() == 1


def test_it_refuses_a_reservation_over_the_gpu_hour_budget(api, project, cluster):
    project.quotas.update(gpu_hours_budget=10)
    response = _reserve(api, gpus=8)  # 8 GPUs x 2 h = 16 GPU-hours
    assert response.status_code == 409
    error = error_of(response)
    assert error["code"] == "quota" and error["limit"] == "gpu_hours_budget"
    assert "budget is 10" in error["fields"]["end"]


def test_it_refuses_an_asap_request_over_the_gpu_hour_budget_with_409_quota(api, project, cluster):
    project.quotas.update(gpu_hours_budget=10)
    response = api.post("/api/v1/bookings/", {"gpus": 8, "duration_s": 7200}, format="json")
    assert response.status_code == 409
    error = error_of(response)
    assert error["code"] == "quota" and error["limit"] == "gpu_hours_budget"
    assert "budget is 10" in error["fields"]["duration_s"]
    assert not Booking.objects.exists()


def test_it_refuses_a_qos_the_quota_does_not_allow(api, project, cluster):
    project.quotas.update(allowed_qos=["low", "normal"])
    response = api.post(
        "/api/v1/bookings/", {"gpus": 1, "duration_s": 3600, "qos": "high"}, format="json"
    )
    assert response.status_code == 400
    assert "allows only low, normal" in error_of(response)["fields"]["qos"]


def test_it_shows_only_my_bookings_to_a_member(api, project, cluster, user):
    other = UserFactory(username="mallory")
    member(other, project)
    mine = _reserve(api).json()
    api.force_authenticate(other)
    assert api.get("/api/v1/bookings/").json()["count"] == 0
    assert api.get(f"/api/v1/bookings/{mine['id']}/").status_code == 404
    response = api.post(f"/api/v1/bookings/{mine['id']}/cancel/")
    assert response.status_code == 404
    assert Booking.objects.get().state == "planned"


def test_it_lets_a_project_manager_see_and_cancel_members_bookings(api, project, cluster):
    mine = _reserve(api).json()
    manager = UserFactory(username="carol")
    member(manager, project, Membership.Role.MANAGER)
    api.force_authenticate(manager)
    assert api.get("/api/v1/bookings/").json()["count"] == 1
    assert api.post(f"/api/v1/bookings/{mine['id']}/cancel/").json()["state"] == "cancelled"


def test_it_cancels_and_frees_the_devices(api, project, cluster):
    project.quotas.update(max_gpus=None)
    first = _reserve(api, gpus=16).json()
    response = api.post(f"/api/v1/bookings/{first['id']}/cancel/")
    assert response.status_code == 200 and response.json()["state"] == "cancelled"
    assert not Allocation.objects.filter(live=True).exists()
    assert _reserve(api, gpus=16).status_code == 201


def test_it_refuses_to_cancel_twice_with_409(api, project, cluster):
    booking = _reserve(api).json()
    api.post(f"/api/v1/bookings/{booking['id']}/cancel/")
    response = api.post(f"/api/v1/bookings/{booking['id']}/cancel/")
    assert response.status_code == 409
    assert error_of(response)["code"] == "invalid_state"


def test_it_refuses_to_cancel_a_finished_booking_and_leaves_it_finished(
    api, user, project, cluster
):
    booking = make_active_booking(list(cluster[0].gpus.all()[:2]), owner=user, project=project)
    assert api.post(f"/api/v1/bookings/{booking.pk}/release/").json()["state"] == "finished"
    booking.refresh_from_db()
    before = (booking.state, booking.ended_at, booking.state_detail)
    ends = sorted(booking.allocations.values_list("end", flat=True))
    facts = DomainEvent.objects.count()
    response = api.post(f"/api/v1/bookings/{booking.pk}/cancel/")
    assert response.status_code == 409
    assert error_of(response)["code"] == "invalid_state"
    assert error_of(response)["message"] == (
        f"Booking {booking.pk} is finished; it cannot be cancelled."
    )
    booking.refresh_from_db()
    assert (booking.state, booking.ended_at, booking.state_detail) == before
    assert sorted(booking.allocations.values_list("end", flat=True)) == ends
    assert DomainEvent.objects.count() == facts  # nothing told: nothing happened


def test_it_extends_a_reservation_when_the_devices_are_free(api, project, cluster):
    booking = _reserve(api).json()
    response = api.post(f"/api/v1/bookings/{booking['id']}/extend/", {"by_s": 1800}, format="json")
    assert response.status_code == 200, response.json()
    assert response.json()["duration_s"] == booking["duration_s"] + 1800
    assert Allocation.objects.get().end - Allocation.objects.get().start == timedelta(
        hours=2, minutes=30
    )


def test_it_refuses_an_extension_into_another_booking_with_409(api, project, cluster):
    project.quotas.update(max_gpus=None)
    first = _reserve(api, gpus=16).json()
    later = timezone.now() + timedelta(hours=3)
    second = api.post(
        "/api/v1/bookings/",
        {"gpus": 16, "start": later.isoformat(), "end": (later + timedelta(hours=1)).isoformat()},
        format="json",
    )
    assert second.status_code == 201
    response = api.post(f"/api/v1/bookings/{first['id']}/extend/", {"by_s": 3600}, format="json")
    assert response.status_code == 409
    assert "by_s" in error_of(response)["fields"]


def _mig_window(api, hours_from_now, hours):
    start = timezone.now() + timedelta(hours=hours_from_now)
    body = {"mig_profile": "1g.10gb", "start": start.isoformat()}
    body["end"] = (start + timedelta(hours=hours)).isoformat()
    response = api.post("/api/v1/bookings/", body, format="json")
    assert response.status_code == 201, response.json()
    return response.json()


def _slice_of(booking) -> int:
    return Allocation.objects.get(booking_id=booking["id"]).mig_instance_id


def test_it_refuses_to_extend_a_mig_slice_into_the_next_booking_of_that_slice(api, project, db):
    make_mig_gpu(make_node("mig-node", gpus=0), 0, profiles=("1g.10gb", "1g.10gb"))
    first = _mig_window(api, 1, 2)
    later = _mig_window(api, 3, 1)  # the same slice: it is free again by then
    assert _slice_of(later) == _slice_of(first)
    response = api.post(f"/api/v1/bookings/{first['id']}/extend/", {"by_s": 1800}, format="json")
    assert response.status_code == 409
    error = error_of(response)
    assert "by_s" in error["fields"] and "1g.10gb" in error["message"]


def test_it_extends_a_mig_slice_while_its_sibling_slice_is_booked(api, project, db):
    make_mig_gpu(make_node("mig-node", gpus=0), 0, profiles=("1g.10gb", "1g.10gb"))
    first = _mig_window(api, 1, 2)
    sibling = _mig_window(api, 1, 5)  # the other slice of the same GPU
    assert _slice_of(sibling) != _slice_of(first)
    response = api.post(f"/api/v1/bookings/{first['id']}/extend/", {"by_s": 3600}, format="json")
    assert response.status_code == 200, response.json()


def test_it_refuses_an_extension_over_the_concurrent_gpu_quota(api, project, cluster):
    from portal.services.booking.bookings import booking_submit
    from tests.factories import ProjectFactory, QuotaFactory

    other, elsewhere = UserFactory(), ProjectFactory(slug="other")
    member(other, elsewhere)
    QuotaFactory(project=elsewhere)
    project.quotas.update(max_gpus=4)
    start = timezone.now() + timedelta(hours=1)
    # Someone else fills node-a first, so this user's two bookings hold different GPUs.
    booking_submit(
        user=other, now=timezone.now(), gpus=8, start=start, end=start + timedelta(hours=2)
    )
    first = _reserve(
        api, gpus=4, start=start.isoformat(), end=(start + timedelta(hours=2)).isoformat()
    ).json()  # node-b
    later = start + timedelta(hours=2)
    body = {"gpus": 4, "start": later.isoformat(), "end": (later + timedelta(hours=1)).isoformat()}
    assert api.post("/api/v1/bookings/", body, format="json").status_code == 201  # node-a
    response = api.post(f"/api/v1/bookings/{first['id']}/extend/", {"by_s": 1800}, format="json")
    assert response.status_code == 409, response.json()
    error = error_of(response)
    assert error["code"] == "quota" and "by_s" in error["fields"]
    assert Booking.objects.get(pk=first["id"]).duration_s == first["duration_s"]


def test_it_rejects_a_bad_extension_amount(api, project, cluster):
    booking = _reserve(api).json()
    response = api.post(f"/api/v1/bookings/{booking['id']}/extend/", {"by_s": -5}, format="json")
    assert response.status_code == 400
    assert "by_s" in error_of(response)["fields"]


def test_it_refuses_an_extension_past_the_site_maximum(api, project, cluster, settings):
    booking = _reserve(api).json()
    by_s = settings.BOOKING_MAX_DURATION_S  # the booking already lasts 2 h
    response = api.post(f"/api/v1/bookings/{booking['id']}/extend/", {"by_s": by_s}, format="json")
    assert response.status_code == 400
    assert "by_s" in error_of(response)["fields"]
    assert Booking.objects.get().duration_s == booking["duration_s"]
    assert Allocation.objects.get().end - Allocation.objects.get().start == timedelta(hours=2)


def test_it_refuses_an_extension_past_the_gpu_hour_budget(api, project, cluster):
    project.quotas.update(gpu_hours_budget=3)
    booking = _reserve(api).json()  # 2 GPU-hours
    response = api.post(f"/api/v1/bookings/{booking['id']}/extend/", {"by_s": 7200}, format="json")
    assert response.status_code == 409
    error = error_of(response)
    assert error["code"] == "quota" and "by_s" in error["fields"]
    assert Booking.objects.get().duration_s == booking["duration_s"]


def test_it_refuses_a_window_too_far_ahead_to_extend(api, project, cluster):
    response = _reserve(api, start="9999-12-31T22:00:00Z", end="9999-12-31T23:00:00Z")
    assert response.status_code == 400  # was 201, then extending it was a 500 (OverflowError)
    assert "end" in error_of(response)["fields"]
    assert not Booking.objects.exists()


def test_it_answers_201_when_an_after_commit_effect_fails(
    api, project, cluster, monkeypatch, django_capture_on_commit_callbacks
):
    from portal import tasks

    def broker_down(*args, **kwargs):
        raise OSError("broker unreachable")

    monkeypatch.setattr(tasks.allocation_pass, "delay", broker_down)
    monkeypatch.setattr(tasks.outbox_dispatch, "delay", broker_down)
    with django_capture_on_commit_callbacks(execute=True):
        response = _reserve(api)
    assert response.status_code == 201  # committed: a 500 would make the client book again
    assert Booking.objects.count() == 1


def test_it_returns_404_for_an_unknown_booking(api, project):
    assert api.get("/api/v1/bookings/999999/").status_code == 404
    assert (
        api.get("/api/v1/bookings/null,null/").status_code == 404
    )  # found by schemathesis: was 500
    assert api.get("/api/v1/bookings/99999999999999999999/").status_code == 404
    assert error_of(api.post("/api/v1/bookings/abc/cancel/"))["code"] == "not_found"


def test_it_requires_authentication(db):
    from rest_framework.test import APIClient

    response = APIClient().get("/api/v1/bookings/")
    assert response.status_code in (401, 403)
    assert error_of(response)["code"] == "not_authenticated"


def test_it_books_the_only_model_the_quota_allows_when_none_is_asked(api, project, db):
    make_node("h100s", model="H100-80GB")
    make_node("a100s", model="A100-80GB")
    project.quotas.update(allowed_models=["A100-80GB"])
    queued = api.post("/api/v1/bookings/", {"gpus": 1, "duration_s": 3600}, format="json").json()
    assert queued["gpu_model"] == "A100-80GB"  # so the allocator places it on an allowed model
    reserved = _reserve(api, gpus=8).json()
    assert [d["node"] for d in reserved["devices"]] == ["a100s"] * 8


def test_it_asks_for_a_model_when_the_quota_allows_several(api, project, db):
    make_node("h100s", model="H100-80GB")
    make_node("a100s", model="A100-80GB")
    project.quotas.update(allowed_models=["A100-80GB", "H100-80GB"])
    response = api.post("/api/v1/bookings/", {"gpus": 1, "duration_s": 3600}, format="json")
    assert response.status_code == 400
    assert "pick one" in error_of(response)["fields"]["gpu_model"]
    assert Booking.objects.count() == 0


def test_it_shows_a_mig_booking_with_null_gpus_in_detail_and_list(api, project, db):
    gpu = make_mig_gpu(make_node("mig-node", gpus=0), 0)
    assert gpu.mig_instances.exists()
    booking = _reserve(api, gpus=None, mig_profile="3g.40gb").json()

    assert booking["gpus"] is None and booking["mig_profile"] == "3g.40gb"
    assert api.get(f"/api/v1/bookings/{booking['id']}/").json()["gpus"] is None
    (listed,) = api.get("/api/v1/bookings/").json()["results"]
    assert listed["gpus"] is None
