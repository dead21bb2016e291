"""Job arrays and dependencies through the API and the allocation pass, on the database."""

from datetime import timedelta

import pytest
from django.utils import timezone

from agents.protocol import Event, EventsRequest
from portal.models import Allocation, Booking, BookingDependency
from portal.services.allocation.allocation import allocation_pass
from portal.services.booking.bookings import booking_transition
from portal.services.fleet.agents import agent_events_record
from portal.services.fleet.selectors import agent_desired
from tests.bounded import measured
from tests.conftest import error_of
from tests.factories import UserFactory, member

pytestmark = pytest.mark.django_db
State = Booking.State


@pytest.fixture(autouse=True)
def _after_commit(django_capture_on_commit_callbacks):
    global _commits
    _commits = django_capture_on_commit_callbacks


def _submit(api, **body):
    with _commits(execute=True):
        response = api.post("/api/v1/bookings/", body, format="json")
    assert response.status_code == 201, response.json()
    return response.json()


def _get(api, booking_id):
    return api.get(f"/api/v1/bookings/{booking_id}/").json()


def _fail(booking_id):
    # What the agent's "exited" with a non-zero code does to the booking.
    booking_transition(booking_id, to=State.FAILED, now=timezone.now(), detail="exit 1")


@pytest.mark.both_databases
def test_it_runs_at_most_the_array_limit_at_once(api, project, cluster):
    project.quotas.update(max_gpus=None)
    first = _submit(api, gpus=1, duration_s=600, command="python task.py", array="0-19%4")
    assert first["array"] == {"job_id": first["id"], "task_id": 0, "spec": "0-19%4"}
    tasks = Booking.objects.filter(array_parent_id=first["id"]).order_by("array_task_id")
    assert [t.array_task_id for t in tasks] == list(range(20))
    assert tasks.filter(state=State.ACTIVE).count() == 4
    waiting = _get(api, tasks.filter(state=State.PENDING).first().pk)
    assert waiting["pending_reason"] == "array_limit"
    assert waiting["state_detail"] == f"array {first['id']}: 4 of at most 4 tasks running"
    # A task that ends lets the next one start, never more than four at once.
    done = tasks.filter(state=State.ACTIVE).first()
    with _commits(execute=True):
        api.post(f"/api/v1/bookings/{done.pk}/release/")
    assert tasks.filter(state=State.ACTIVE).count() == 4
    assert tasks.filter(state=State.FINISHED).count() == 1


def test_it_gives_each_array_task_its_task_id_on_the_node(api, project, cluster):
    first = _submit(api, gpus=1, duration_s=600, command="python task.py", array="3,5")
    node = cluster[0]
    desired = {b.booking_id: b for b in agent_desired(node_id=node.pk).bookings}
    tasks = Booking.objects.filter(array_parent_id=first["id"])
    assert {(desired[t.pk].array_job_id, desired[t.pk].array_task_id) for t in tasks} == {
        (first["id"], 3),
        (first["id"], 5),
    }


def test_it_gives_every_array_task_the_job_environment_of_the_first(api, project, cluster):
    project.quotas.update(max_gpus=None)
    first = _submit(
        api,
        gpus=1,
        duration_s=600,
        command="python task.py",
        array="0-2",
        workdir="/scratch/sweep",
        env={"LR": "0.1"},
        signal="USR1@60",
    )
    tasks = [_get(api, t.pk) for t in Booking.objects.filter(array_parent_id=first["id"])]
    assert len(tasks) == 3
    for task in tasks:
        assert (task["workdir"], task["env"], task["signal"]) == (
            "/scratch/sweep",
            {"LR": "0.1"},
            "USR1@60",
        )


@pytest.mark.both_databases
def test_it_starts_a_booking_after_its_dependency_finished(api, project, cluster):
    project.quotas.update(max_gpus=None)
    first = _submit(api, gpus=1, duration_s=600, command="train")
    second = _submit(api, gpus=1, duration_s=600, command="eval", after=f"afterok:{first['id']}")
    shown = _get(api, second["id"])
    assert shown["state"] == "pending"
    assert shown["pending_reason"] == "dependency"
    assert shown["state_detail"] == f"waits for afterok:{first['id']}"
    assert shown["dependencies"] == [{"kind": "afterok", "booking": first["id"]}]
    assert shown["planned_start"] is None
    with _commits(execute=True):
        api.post(f"/api/v1/bookings/{first['id']}/release/")
    assert _get(api, second["id"])["state"] == "active"


@pytest.mark.both_databases
def test_it_ends_a_booking_after_a_failed_one_and_says_why(api, project, cluster):
    first = _submit(api, gpus=1, duration_s=600, command="train")
    second = _submit(api, gpus=1, duration_s=600, command="eval", after=f"afterok:{first['id']}")
    third = _submit(
        api, gpus=1, duration_s=600, command="cleanup", after=f"afternotok:{first['id']}"
    )
    _fail(first["id"])
    allocation_pass(now=timezone.now())
    ended = _get(api, second["id"])
    assert ended["state"] == "cancelled"
    assert ended["state_detail"] == (
        f"dependency never satisfied: booking {first['id']} did not end successfully (afterok)"
    )
    assert ended["pending_reason"] == "" and ended["started_at"] is None
    assert _get(api, third["id"])["state"] == "active"


@pytest.mark.both_databases
@pytest.mark.parametrize("requeue", [True, False], ids=["requeued", "failed"])
def test_it_starts_no_afterok_dependent_of_a_job_its_agent_stopped(
    api, project, cluster, settings, requeue
):
    """The job's agent stopped while it ran: no success. Requeued, every dependent waits on;
    failed (no requeue after node failures), afternotok and afterany ones run, afterok never."""
    settings.REQUEUE_ON_NODE_FAILURE = requeue
    project.quotas.update(max_gpus=None)
    first = _submit(api, gpus=1, duration_s=600, command="train")
    after = {
        kind: _submit(api, gpus=1, duration_s=600, command="next", after=f"{kind}:{first['id']}")
        for kind in ("afterok", "afternotok", "afterany")
    }
    node = Allocation.objects.filter(booking_id=first["id"], live=True).first().gpu.node
    stopped = Event(
        "stopped",
        timezone.now(),
        "stopped",
        first["id"],
        exit_code=-15,
        interrupted="agent_stopped",
    )
    with _commits(execute=True):
        agent_events_record(node=node, request=EventsRequest([stopped]))
    allocation_pass(now=timezone.now())
    target = _get(api, first["id"])
    states = {kind: _get(api, booking["id"])["state"] for kind, booking in after.items()}
    if requeue:
        assert target["restart_count"] == 1 and target["state"] in ("pending", "active"), target
        assert states == {"afterok": "pending", "afternotok": "pending", "afterany": "pending"}
    else:
        assert (target["state"], target["restart_count"]) == ("failed", 0), target
        assert target["state_detail"] == "the node's agent stopped while it ran (node node-a)"
        assert states == {"afterok": "cancelled", "afternotok": "active", "afterany": "active"}


@pytest.mark.both_databases
def test_it_never_starts_an_afterok_dependent_of_a_cancelled_booking(api, project, cluster):
    # A cancelled booking did not end successfully: its afterok dependents are ended unstarted,
    # its afternotok ones run.
    project.quotas.update(max_gpus=None)
    first = _submit(api, gpus=1, duration_s=600, command="train")
    second = _submit(api, gpus=1, duration_s=600, command="eval", after=f"afterok:{first['id']}")
    third = _submit(
        api, gpus=1, duration_s=600, command="cleanup", after=f"afternotok:{first['id']}"
    )
    with _commits(execute=True):
        assert api.post(f"/api/v1/bookings/{first['id']}/cancel/").status_code == 200
    allocation_pass(now=timezone.now())
    ended = _get(api, second["id"])
    assert (ended["state"], ended["started_at"]) == ("cancelled", None)
    assert ended["state_detail"] == (
        f"dependency never satisfied: booking {first['id']} did not end successfully (afterok)"
    )
    assert not Booking.objects.get(pk=second["id"]).allocations.exists()
    assert _get(api, third["id"])["state"] == "active"


@pytest.mark.both_databases
def test_it_waits_for_every_task_of_an_array_named_by_its_first_task(api, project, cluster):
    project.quotas.update(max_gpus=None)
    first = _submit(api, gpus=1, duration_s=600, command="t", array="0-2")
    tasks = set(Booking.objects.filter(array_parent_id=first["id"]).values_list("pk", flat=True))
    merge = _submit(api, gpus=1, duration_s=600, command="merge", after=f"afterany:{first['id']}")
    shown = _get(api, merge["id"])
    assert {d["booking"] for d in shown["dependencies"]} == tasks
    assert shown["state"] == "pending"
    with _commits(execute=True):
        api.post(f"/api/v1/bookings/{first['id']}/release/")  # one task ended, two still run
    assert _get(api, merge["id"])["state"] == "pending"
    allocation_pass(now=timezone.now() + timedelta(seconds=601))  # the others reach their end
    assert _get(api, merge["id"])["state"] == "active"


@pytest.mark.parametrize(
    ("body", "field", "says"),
    [
        ({"array": "5-2"}, "array", "count up"),
        ({"array": "0-9%0"}, "array", "running limit"),
        ({"array": "0-5000"}, "array", "at most 1000"),
        ({"array": "0-3", "command": ""}, "array", "command"),
        ({"after": "afterwards:1"}, "after", "afterok"),
        ({"after": "afterok:999999"}, "after", "no booking 999999"),
        ({"after": "afterok:x"}, "after", "not a booking id"),
    ],
)
def test_it_refuses_a_bad_array_or_dependency_naming_the_field(
    api, project, cluster, body, field, says
):
    body = {"gpus": 1, "duration_s": 600, "command": "run", **body}
    before = Booking.objects.count()
    response = api.post("/api/v1/bookings/", body, format="json")
    assert response.status_code == 400, response.json()
    error = error_of(response)
    assert set(error["fields"]) == {field} and says in error["fields"][field], error
    assert Booking.objects.count() == before  # nothing half-written


@pytest.mark.parametrize("path", ["/api/v1/bookings/", "/api/v1/bookings/estimate/"])
@pytest.mark.parametrize("spec", ["0-99999999999999999999", "0-9,10-99999999999999999999%4"])
def test_it_refuses_a_huge_array_range_at_once_without_building_it(
    api, project, cluster, path, spec
):
    body = {"gpus": 1, "duration_s": 600, "command": "run", "array": spec}
    api.post(path, {**body, "array": "0-5000"}, format="json")  # imports and caches warm
    with measured() as cost:
        response = api.post(path, body, format="json")
    assert response.status_code == 400, response.json()
    assert error_of(response)["fields"] == {
        "array": "an array has at most 1000 tasks (e.g. 0-99%10)."
    }
    assert cost.cheap(), cost  # well under a second, and no list of ids was made
    assert not Booking.objects.exists()


@pytest.mark.parametrize(
    ("body", "field"),
    [({"array": "٠-٩"}, "array"), ({"array": "0-3%٢"}, "array"), ({"after": "afterok:١"}, "after")],
)
def test_it_refuses_array_and_dependency_digits_other_than_ascii(
    api, project, cluster, body, field
):
    body = {"gpus": 1, "duration_s": 600, "command": "run", **body}
    for path in ("/api/v1/bookings/", "/api/v1/bookings/estimate/"):
        response = api.post(path, body, format="json")
        assert response.status_code == 400, response.json()
        assert set(error_of(response)["fields"]) == {field}
    assert not Booking.objects.exists()


def test_it_refuses_an_array_after_an_array_that_would_write_too_many_dependencies(
    api, project, cluster
):
    first = _submit(api, gpus=1, duration_s=600, command="t", array="0-199")
    body = {"gpus": 1, "duration_s": 600, "command": "x", "array": "0-199"}
    response = api.post(
        "/api/v1/bookings/", {**body, "after": f"afterany:{first['id']}"}, format="json"
    )
    assert response.status_code == 400
    assert "at most 20000" in error_of(response)["fields"]["after"]


def test_it_refuses_a_dependency_that_can_never_be_met_at_submit(api, project, cluster):
    first = _submit(api, gpus=1, duration_s=600, command="train")
    _fail(first["id"])
    response = api.post(
        "/api/v1/bookings/",
        {"gpus": 1, "duration_s": 600, "command": "x", "after": f"afterok:{first['id']}"},
        format="json",
    )
    assert response.status_code == 400
    assert "could never start" in error_of(response)["fields"]["after"]


def test_it_refuses_a_dependency_on_someone_elses_booking(api, project, cluster):
    stranger = UserFactory(username="zed")
    member(stranger, project)
    theirs = Booking.objects.create(
        owner=stranger, project=project, gpus=1, duration_s=60, submitted_at=timezone.now()
    )
    response = api.post(
        "/api/v1/bookings/",
        {"gpus": 1, "duration_s": 600, "after": f"afterok:{theirs.pk}"},
        format="json",
    )
    assert response.status_code == 400
    assert f"no booking {theirs.pk}" in error_of(response)["fields"]["after"]


def test_it_refuses_an_array_or_dependency_on_a_reservation(api, project, cluster):
    start = timezone.now() + timedelta(hours=1)
    window = {"start": start.isoformat(), "end": (start + timedelta(hours=1)).isoformat()}
    response = api.post(
        "/api/v1/bookings/", {"gpus": 1, "command": "x", "array": "0-3", **window}, format="json"
    )
    assert response.status_code == 400
    assert "queued" in error_of(response)["fields"]["array"]


def test_it_lists_arrays_and_dependencies_as_the_detail_view_does(api, project, cluster):
    first = _submit(api, gpus=1, duration_s=600, command="t", array="0-2%1")
    later = _submit(api, gpus=1, duration_s=600, command="x", after=f"afterany:{first['id']}")
    rows = {row["id"]: row for row in api.get("/api/v1/bookings/").json()["results"]}
    for booking_id in (first["id"], later["id"]):
        assert rows[booking_id] == _get(api, booking_id)
    assert BookingDependency.objects.filter(booking_id=later["id"]).count() == 3  # every task


def test_it_estimates_a_dependent_booking_as_waiting_for_its_dependency(api, project, cluster):
    first = _submit(api, gpus=1, duration_s=600, command="train")
    response = api.post(
        "/api/v1/bookings/estimate/",
        {"gpus": 1, "duration_s": 600, "after": f"afterok:{first['id']}"},
        format="json",
    )
    assert response.status_code == 200, response.json()
    assert response.json()["pending_reason"] == "dependency"


def test_it_cancels_every_task_of_an_array_left_to_end_in_one_call(api, project, cluster):
    first = _submit(api, gpus=1, duration_s=600, command="t", array="0-3")
    done = Booking.objects.get(array_parent_id=first["id"], array_task_id=1)
    with _commits(execute=True):
        api.post(f"/api/v1/bookings/{done.pk}/release/")
    with _commits(execute=True):
        response = api.post(f"/api/v1/bookings/{first['id']}/cancel-array/")
    assert response.status_code == 200, response.json()
    body = response.json()
    assert (body["array"], body["states"]) == (first["id"], {"cancelled": 3, "finished": 1})
    assert sorted(body["cancelled"]) == sorted(
        Booking.objects.filter(array_parent_id=first["id"], state=State.CANCELLED).values_list(
            "pk", flat=True
        )
    )
    again = api.post(f"/api/v1/bookings/{first['id']}/cancel-array/")
    assert again.status_code == 409 and "no task left" in error_of(again)["message"]


def test_it_refuses_to_cancel_as_an_array_what_names_no_array_of_yours(api, project, cluster):
    single = _submit(api, gpus=1, duration_s=600, command="t")
    first = _submit(api, gpus=1, duration_s=600, command="t", array="0-1")
    second = Booking.objects.get(array_parent_id=first["id"], array_task_id=1)
    for booking_id in (single["id"], second.pk, 999999):
        response = api.post(f"/api/v1/bookings/{booking_id}/cancel-array/")
        assert response.status_code == 404, (booking_id, response.json())
    assert Booking.objects.filter(state=State.CANCELLED).count() == 0
