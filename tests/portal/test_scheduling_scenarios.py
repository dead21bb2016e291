"""Scheduling as a user sees it, on both databases (marker both_databases).

The suite runs on PostgreSQL; tests/portal/test_both_databases.py runs these again on SQLite,
the embedded default mode's database, so the two cannot drift apart unnoticed. Each asserts the
numbers a user reads: planned start, queue position, whether it starts now, the priority factors.
"""

from datetime import timedelta

import pytest
from django.utils import timezone

from portal.models import Booking
from portal.services.allocation.allocation import allocation_pass
from tests.conftest import error_of
from tests.factories import (
    AllocationFactory,
    BookingFactory,
    ProjectFactory,
    QuotaFactory,
    UserFactory,
    make_active_booking,
    make_node,
    member,
)

pytestmark = [pytest.mark.django_db, pytest.mark.both_databases]


@pytest.fixture(autouse=True)
def _after_commit(django_capture_on_commit_callbacks, project):
    """Run after-commit effects (the allocation pass) as a real commit would; no quota limits."""
    global _commits
    _commits = django_capture_on_commit_callbacks
    project.quotas.update(max_gpus=None)


def _submit(api, **body):
    with _commits(execute=True):
        response = api.post("/api/v1/bookings/", body, format="json")
    assert response.status_code == 201, response.json()
    return _get(api, response.json()["id"])


def _get(api, booking_id):
    return api.get(f"/api/v1/bookings/{booking_id}/").json()


def _at(text: str):
    return timezone.datetime.fromisoformat(text)


def _seconds_apart(a: str, b) -> float:
    return abs((_at(a) - (b if not isinstance(b, str) else _at(b))).total_seconds())


def test_it_plans_queued_bookings_at_the_running_bookings_end_in_order(api, cluster):
    hog = _submit(api, gpus=16, duration_s=7200)
    first = _submit(api, gpus=8, duration_s=600)
    second = _submit(api, gpus=8, duration_s=600)
    first, second = _get(api, first["id"]), _get(api, second["id"])
    assert hog["state"] == "active"
    assert (first["state"], first["queue_position"]) == ("pending", 1)
    assert (second["state"], second["queue_position"]) == ("pending", 2)
    assert first["pending_reason"] == second["pending_reason"] == "resources"
    assert _seconds_apart(first["planned_start"], hog["end"]) < 5
    assert _seconds_apart(second["planned_start"], hog["end"]) < 5


def test_it_estimates_a_request_behind_the_queue_at_the_running_bookings_end(api, cluster):
    hog = _submit(api, gpus=16, duration_s=7200)
    _submit(api, gpus=4, duration_s=600)
    response = api.post("/api/v1/bookings/estimate/", {"gpus": 2, "duration_s": 600}, format="json")
    assert response.status_code == 200, response.json()
    body = response.json()
    assert (body["pending_reason"], body["queue_position"]) == ("resources", 2)
    assert _seconds_apart(body["planned_start"], hog["end"]) < 5


def test_it_backfills_a_short_request_without_delaying_the_first_in_line(api, cluster):
    """node-a held for 3 h, 6 of node-b's 8 for 2 h: the head (8 GPUs) starts on node-b at 2 h."""
    _submit(api, gpus=8, duration_s=3 * 3600)
    six = _submit(api, gpus=6, duration_s=2 * 3600)
    head = _submit(api, gpus=8, duration_s=3600)
    short = _submit(api, gpus=2, duration_s=1800)  # on node-b's 2 free, gone before 2 h
    long = _submit(api, gpus=2, duration_s=3 * 3600)  # there, it would push the head to 3 h
    head, long = _get(api, head["id"]), _get(api, long["id"])
    assert short["state"] == "active"
    assert (head["queue_position"], long["queue_position"]) == (1, 2)
    assert _seconds_apart(head["planned_start"], six["end"]) < 5
    assert _seconds_apart(long["planned_start"], _at(six["end"]) + timedelta(hours=1)) < 5


def test_it_reserves_a_window_only_where_devices_are_free(api, cluster):
    hog = _submit(api, gpus=16, duration_s=7200)
    during = _at(hog["start"]) + timedelta(hours=1)
    clash = api.post(
        "/api/v1/bookings/",
        {"gpus": 2, "start": during.isoformat(), "end": (during + timedelta(hours=1)).isoformat()},
        format="json",
    )
    assert clash.status_code == 409, clash.json()
    after = _at(hog["end"])
    with _commits(execute=True):
        reserved = api.post(
            "/api/v1/bookings/",
            {
                "gpus": 2,
                "start": after.isoformat(),
                "end": (after + timedelta(hours=1)).isoformat(),
            },
            format="json",
        )
    assert reserved.status_code == 201, reserved.json()
    waiting = _submit(api, gpus=16, duration_s=600)  # behind the hog and the reservation
    assert _seconds_apart(waiting["planned_start"], after + timedelta(hours=1)) < 5
    allocation_pass(now=after + timedelta(seconds=1))
    assert _get(api, reserved.json()["id"])["state"] == "active"


def test_it_gives_the_project_that_used_less_the_higher_fair_share(api, user, project, cluster):
    """Vision used all 16 GPUs for two hours; NLP used nothing: NLP's request comes first."""
    now = timezone.now()
    used = BookingFactory(owner=user, project=project, gpus=16, state=Booking.State.FINISHED)
    for gpu in [gpu for node in cluster for gpu in node.gpus.all()]:
        AllocationFactory(
            booking=used, gpu=gpu, start=now - timedelta(hours=3), end=now - timedelta(hours=1)
        )
    bob, nlp = UserFactory(username="bob"), ProjectFactory(slug="nlp")
    member(bob, nlp)
    QuotaFactory(project=nlp, max_gpus=None)
    _submit(api, gpus=16, duration_s=7200)
    ours = _submit(api, gpus=8, duration_s=600)
    api.force_authenticate(bob)
    theirs = _get(api, _submit(api, gpus=8, duration_s=600)["id"])
    api.force_authenticate(user)
    ours = _get(api, ours["id"])
    assert 0 < ours["priority"]["fairshare"] < theirs["priority"]["fairshare"]


def test_it_raises_the_age_factor_of_a_booking_that_waited(api, cluster):
    _submit(api, gpus=16, duration_s=7200)
    waiting = _submit(api, gpus=8, duration_s=600)
    Booking.objects.filter(pk=waiting["id"]).update(
        submitted_at=timezone.now() - timedelta(hours=1)
    )
    allocation_pass(now=timezone.now())
    assert _get(api, waiting["id"])["priority"]["age"] > 0


def test_it_moves_the_planned_start_of_the_queue_when_the_running_booking_is_extended(api, cluster):
    hog = _submit(api, gpus=16, duration_s=3600)
    waiting = _submit(api, gpus=8, duration_s=600)
    with _commits(execute=True):
        response = api.post(f"/api/v1/bookings/{hog['id']}/extend/", {"by_s": 3600}, format="json")
    assert response.status_code == 200, response.json()
    extended = _get(api, hog["id"])
    assert _seconds_apart(extended["end"], _at(hog["end"]) + timedelta(hours=1)) < 1
    assert _seconds_apart(_get(api, waiting["id"])["planned_start"], extended["end"]) < 5


def test_it_keeps_a_two_node_booking_on_one_model_unless_any_will_do(api, user, project):
    # One H100 node and two A100 nodes, one of them busy for an hour: `--nodes 2` with no model
    # waits for the two A100 nodes rather than start now on one H100 and one A100 node.
    make_node("h1", model="H100-80GB"), make_node("a1")
    busy = make_node("a2")
    hog = make_active_booking(list(busy.gpus.all()), owner=user, project=project, gpus=8)
    hog_end = hog.allocations.first().end
    body = {"node_count": 2, "duration_s": 600, "command": "python train.py"}
    with _commits(execute=True):
        estimate = api.post("/api/v1/bookings/estimate/", body, format="json").json()
    one = _submit(api, **body)
    assert (one["state"], one["mixed_models"], one["devices"]) == ("pending", False, [])
    assert _seconds_apart(one["planned_start"], hog_end) < 2
    assert _seconds_apart(estimate["planned_start"], hog_end) < 2
    mixed = _submit(api, **body, mixed_models=True)
    assert (mixed["state"], mixed["mixed_models"]) == ("active", True)
    models = {(d["node"], d["model"]) for d in mixed["devices"]}
    assert models == {("h1", "H100-80GB"), ("a1", "A100-80GB")}
    assert len(mixed["devices"]) == 16


@pytest.mark.parametrize(
    ("extra", "said"),
    [
        ({"mixed_models": "perhaps"}, "Must be a valid boolean."),
        ({"mixed_models": True, "gpu_model": "A100-80GB"}, "give either gpu_model"),
    ],
)
def test_it_refuses_a_bad_mixed_models_naming_the_field(api, cluster, extra, said):
    body = {"gpus": 2, "duration_s": 600, **extra}
    response = api.post("/api/v1/bookings/", body, format="json")
    assert response.status_code == 400
    assert said in error_of(response)["fields"]["mixed_models"]
    assert not Booking.objects.exists()
