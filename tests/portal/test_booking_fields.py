"""What a booking's fields say through its life: start and end, planned start, state detail,
what is left of a run after a requeue, and me/quota/ as its schema says."""

from datetime import timedelta

import pytest
from django.utils import timezone

from portal.models import Allocation, Booking
from portal.services.allocation.allocation import allocation_pass
from portal.services.booking.bookings import booking_stop
from tests.factories import make_node

pytestmark = pytest.mark.django_db


def _get(api, booking_id):
    return api.get(f"/api/v1/bookings/{booking_id}/").json()


def _listed(api, booking_id):
    (row,) = [b for b in api.get("/api/v1/bookings/").json()["results"] if b["id"] == booking_id]
    return row


def test_it_shows_an_asap_bookings_start_and_end_once_it_has_devices(api, project, cluster, submit):
    project.quotas.update(max_gpus=None)
    running = submit(gpus=16, duration_s=3600)
    waiting = submit(gpus=1, duration_s=600)
    for view in (_get, _listed):
        body = view(api, running)
        assert body["state"] == "active"
        assert body["start"] == body["started_at"] == body["devices"][0]["start"]
        assert body["end"] == body["devices"][0]["end"]
        held = timezone.datetime.fromisoformat(body["end"]) - timezone.datetime.fromisoformat(
            body["start"]
        )
        assert held == timedelta(hours=1)
        queued = view(api, waiting)
        assert queued["state"] == "pending" and queued["start"] is None and queued["end"] is None


def test_it_shows_the_real_end_of_an_asap_booking_released_early(
    api, project, cluster, submit, django_capture_on_commit_callbacks
):
    booking = submit(gpus=1, duration_s=3600)
    with django_capture_on_commit_callbacks(execute=True):
        released = api.post(f"/api/v1/bookings/{booking}/release/").json()
    assert released["state"] == "finished"
    assert released["end"] == released["ended_at"]


def test_it_clears_the_planned_start_when_a_booking_is_cancelled(
    api, project, cluster, submit, django_capture_on_commit_callbacks
):
    project.quotas.update(max_gpus=None)
    submit(gpus=16, duration_s=3600)
    waiting = submit(gpus=2, duration_s=600)
    assert _get(api, waiting)["planned_start"] is not None
    with django_capture_on_commit_callbacks(execute=True):
        cancelled = api.post(f"/api/v1/bookings/{waiting}/cancel/").json()
    assert cancelled["state"] == "cancelled"
    assert cancelled["planned_start"] is None and cancelled["queue_position"] is None
    assert cancelled["pending_reason"] == ""


def test_it_drops_why_a_booking_waited_once_it_starts(
    api, project, cluster, submit, django_capture_on_commit_callbacks
):
    project.quotas.update(max_gpus=None)
    hog = submit(gpus=16, duration_s=3600)
    waiting = submit(gpus=2, duration_s=600)
    assert _get(api, waiting)["state_detail"]  # "Waiting for ..."
    with django_capture_on_commit_callbacks(execute=True):
        api.post(f"/api/v1/bookings/{hog}/release/")
    started = _get(api, waiting)
    assert started["state"] == "active"
    assert started["state_detail"] == "" and started["pending_reason"] == ""


def test_it_shows_nothing_of_the_last_run_on_a_requeued_booking(
    api, user, project, db, submit, django_capture_on_commit_callbacks
):
    node = make_node("node-a", gpus=2)
    batch = submit(gpus=2, duration_s=3600, command="python train.py")
    assert _get(api, batch)["state"] == "active"
    Booking.objects.filter(pk=batch).update(exit_code=137, log_tail="Killed\n")
    node.state = "down"
    node.save(update_fields=["state"])
    assert booking_stop(booking_id=batch, to="failed", now=timezone.now(), detail="node down")
    for view in (_get, _listed):
        body = view(api, batch)
        assert body["state"] == "pending"
        assert body["devices"] == [] and body["cuda_visible_devices"] == ""
        assert body["start"] is None and body["end"] is None and body["started_at"] is None
        assert body["exit_code"] is None and body["log_tail"] == ""
    # It runs again, then ends: it shows this run's devices only, not the first run's too.
    node.state = "up"
    node.save(update_fields=["state"])
    allocation_pass(now=timezone.now())
    with django_capture_on_commit_callbacks(execute=True):
        ended = api.post(f"/api/v1/bookings/{batch}/release/").json()
    assert ended["state"] == "finished"
    assert Allocation.objects.filter(booking_id=batch).count() == 4
    assert len(ended["devices"]) == 2
    assert ended["start"] == ended["started_at"] and ended["end"] == ended["ended_at"]
    assert _listed(api, batch) == ended


def _json_schema(node):
    """OpenAPI 3.0's schema as JSON Schema: `nullable: true` becomes a "null" type."""
    if isinstance(node, list):
        return [_json_schema(item) for item in node]
    if not isinstance(node, dict):
        return node
    out = {key: _json_schema(value) for key, value in node.items() if key != "nullable"}
    if node.get("nullable") and "type" in node:
        out["type"] = [node["type"], "null"]
    return out


def test_it_answers_me_quota_as_its_schema_says(api, project):
    import jsonschema

    schema = api.get("/api/schema/?format=json").json()
    operation = schema["paths"]["/api/v1/me/quota/"]["get"]
    shape = operation["responses"]["200"]["content"]["application/json"]["schema"]
    body = api.get("/api/v1/me/quota/").json()
    jsonschema.validate(body, _json_schema({**shape, "components": schema["components"]}))
    components = schema["components"]["schemas"]
    assert components[shape["$ref"].rsplit("/", 1)[1]]["type"] == "object"
    assert body["results"][0]["project"] == "vision"


def test_it_documents_the_refusals_of_submit_and_estimate(api):
    schema = api.get("/api/schema/?format=json").json()
    create = schema["paths"]["/api/v1/bookings/"]["post"]["responses"]
    estimate = schema["paths"]["/api/v1/bookings/estimate/"]["post"]["responses"]
    assert {"200", "201", "400", "409", "422", "503"} <= set(create)
    assert {"200", "400", "409", "429"} <= set(estimate)
    error = create["409"]["content"]["application/json"]["schema"]["$ref"].rsplit("/", 1)[1]
    assert set(schema["components"]["schemas"][error]["properties"]) == {"error"}
    output = schema["paths"]["/api/v1/bookings/estimate/"]["post"]["responses"]["200"]
    name = output["content"]["application/json"]["schema"]["$ref"].rsplit("/", 1)[1]
    assert set(schema["components"]["schemas"][name]["properties"]) == {
        "planned_start",
        "queue_position",
        "pending_reason",
        "state_detail",
        "next_window",
    }
