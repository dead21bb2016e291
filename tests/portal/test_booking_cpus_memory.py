"""Cores and host memory with a booking (issue 40): asked at submit, read into the allocator's
snapshot, re-checked at start, returned by the API."""

from datetime import timedelta
from functools import partial

import pytest
from django.utils import timezone

from portal.models import Allocation, Booking, Node
from portal.services.allocation.snapshot import snapshot_take
from portal.services.core.policy import scheduler_policy
from portal.services.fleet.selectors import agent_desired
from portal.services.inventory.resources import resources_fit
from tests.conftest import error_of
from tests.factories import AllocationFactory, BookingFactory, make_active_booking, make_node

pytestmark = pytest.mark.django_db


def _sized(node: Node, *, cpus: int, memory_mib: int) -> Node:
    Node.objects.filter(pk=node.pk).update(cpus=cpus, memory_mib=memory_mib)
    node.cpus, node.memory_mib = cpus, memory_mib
    return node


@pytest.fixture
def sized(db):
    """One up node of 8 A100s with 96 cores and 1 TiB."""
    return _sized(make_node("gpu-a01"), cpus=96, memory_mib=1024 * 1024)


@pytest.mark.both_databases
def test_it_stores_and_returns_the_cores_and_memory_asked_and_what_it_holds_once_running(
    api, post_booking, project, sized
):
    response = post_booking(gpus=2, duration_s=3600, cpus=16, memory_mib="64G")
    assert response.status_code == 201, response.json()
    booking = Booking.objects.get(pk=response.json()["id"])
    assert (booking.cpus, booking.memory_mib) == (16, 65536)
    detail = api.get(f"/api/v1/bookings/{booking.pk}/").json()
    assert detail["state"] == "active"
    assert (detail["cpus"], detail["memory_mib"]) == (16, 65536)
    assert detail["held"] == [{"node": "gpu-a01", "cpus": 16, "memory_mib": 65536}]
    listed = api.get("/api/v1/bookings/").json()["results"][0]
    assert (listed["cpus"], listed["memory_mib"]) == (16, 65536)


@pytest.mark.both_databases
def test_it_holds_the_nodes_share_when_none_is_asked(api, post_booking, project, sized):
    response = post_booking(gpus=2, duration_s=3600)
    detail = api.get(f"/api/v1/bookings/{response.json()['id']}/").json()
    assert (detail["cpus"], detail["memory_mib"]) == (None, None)
    # 2 of 8 GPUs: a quarter of 96 cores and of 1 TiB (scheduler.resources.node_demand).
    assert detail["held"] == [{"node": "gpu-a01", "cpus": 24, "memory_mib": 262144}]


@pytest.mark.parametrize(
    ("memory", "mib"), [(65536, 65536), ("65536", 65536), ("512M", 512), ("1T", 1048576)]
)
def test_it_takes_memory_in_mib_or_with_a_unit(post_booking, project, sized, memory, mib):
    response = post_booking(gpus=1, duration_s=3600, memory_mib=memory)
    assert response.status_code == 201, response.json()
    assert Booking.objects.get(pk=response.json()["id"]).memory_mib == mib


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"cpus": 0}, "cpus"),
        ({"cpus": -4}, "cpus"),
        ({"cpus": "many"}, "cpus"),
        ({"memory_mib": 0}, "memory_mib"),
        ({"memory_mib": -1}, "memory_mib"),
        ({"memory_mib": "64X"}, "memory_mib"),
        ({"memory_mib": "0G"}, "memory_mib"),
        ({"memory_mib": True}, "memory_mib"),
        ({"memory_mib": 1.5}, "memory_mib"),
        ({"gpus": 0, "cpus": 8}, "gpus"),
    ],
)
def test_it_refuses_bad_cores_or_memory_naming_the_field_and_writes_nothing(
    post_booking, project, sized, body, field
):
    response = post_booking(**{"gpus": 1, "duration_s": 3600, **body})
    assert response.status_code == 400, response.json()
    assert field in error_of(response)["fields"]
    assert not Booking.objects.exists()


def test_it_refuses_an_estimate_with_bad_memory_as_a_submission_would(api, project, sized):
    response = api.post(
        "/api/v1/bookings/estimate/", {"gpus": 1, "duration_s": 60, "memory_mib": "9Q"}
    )
    assert response.status_code == 400
    assert "memory_mib" in error_of(response)["fields"]


@pytest.mark.parametrize(
    ("body", "field"), [({"cpus": 97}, "cpus"), ({"memory_mib": "2T"}, "memory_mib")]
)
def test_it_refuses_more_cores_or_memory_than_any_node_has(
    post_booking, project, sized, body, field
):
    response = post_booking(gpus=1, duration_s=3600, **body)
    assert response.status_code == 400, response.json()
    assert field in error_of(response)["fields"]
    assert not Booking.objects.exists()


@pytest.mark.both_databases
def test_it_never_starts_a_booking_its_nodes_cores_cannot_hold(
    api, post_booking, project, sized, user
):
    gpus = list(sized.gpus.order_by("index"))
    make_active_booking(gpus[:2], cpus=90)
    response = post_booking(gpus=1, duration_s=3600, cpus=8)
    assert response.status_code == 201, response.json()
    detail = api.get(f"/api/v1/bookings/{response.json()['id']}/").json()
    # The GPUs are free but 6 of 96 cores are: it waits for cores, and says so.
    assert detail["state"] == "pending" and detail["held"] == []
    assert detail["pending_reason"] == "cpus", detail
    assert "6 of 96 cores free" in detail["state_detail"], detail


@pytest.mark.both_databases
def test_it_starts_it_when_the_cores_are_free(api, post_booking, project, sized):
    gpus = list(sized.gpus.order_by("index"))
    make_active_booking(gpus[:2], cpus=88)
    response = post_booking(gpus=1, duration_s=3600, cpus=8)
    assert api.get(f"/api/v1/bookings/{response.json()['id']}/").json()["state"] == "active"


def test_it_reads_cores_memory_and_their_limits_into_the_allocators_snapshot(project, sized, user):
    other = _sized(make_node("gpu-b01", gpus=4), cpus=48, memory_mib=512 * 1024)
    make_node("old-agent", gpus=2)  # reports no cores: counts neither
    running = make_active_booking(list(other.gpus.all())[:1], cpus=4, memory_mib=2048)
    queued = Booking.objects.create(
        owner=user,
        project=project,
        gpus=1,
        duration_s=600,
        submitted_at=timezone.now() - timedelta(seconds=5),
        cpus=12,
    )
    project.quotas.update(max_cpus=64, max_memory_mib=4096)
    state = snapshot_take(now=timezone.now()).state
    assert {name: (r.cpus, r.memory_mib, r.gpus) for name, r in state.node_resources.items()} == {
        "gpu-a01": (96, 1048576, 8),
        "gpu-b01": (48, 524288, 4),
    }
    (request,) = [r for r in state.pending if r.booking_id == str(queued.pk)]
    assert (request.cpus, request.memory_mib) == (12, None)
    (held,) = [a for a in state.allocations if a.booking_id == str(running.pk)]
    assert (held.cpus, held.memory_mib) == (4, 2048)
    quota = state.project_quotas[project.slug]
    assert (quota.max_cpus, quota.max_memory_mib) == (64, 4096)


def test_it_sends_the_agent_the_cores_and_memory_each_booking_holds_asked_or_default(sized):
    gpus = list(sized.gpus.order_by("index"))
    asked = make_active_booking(gpus[:1], cpus=10, memory_mib=4096)
    default = make_active_booking(gpus[1:3])
    desired = {b.booking_id: b for b in agent_desired(node_id=sized.pk).bookings}
    assert (desired[asked.pk].cpus, desired[asked.pk].memory_mib) == (10, 4096)
    # 2 of 8 GPUs, nothing asked: a quarter of the node (scheduler.resources.node_demand).
    assert (desired[default.pk].cpus, desired[default.pk].memory_mib) == (24, 262144)


def test_it_sends_no_limits_on_a_node_that_reports_no_cores(db):
    node = make_node("old-agent", gpus=1)
    booking = make_active_booking(list(node.gpus.all()), cpus=4)
    (desired,) = agent_desired(node_id=node.pk).bookings
    assert desired.booking_id == booking.pk and desired.cpus is None


def test_it_counts_only_the_cores_held_at_once_when_a_start_is_rechecked(sized):
    now = timezone.now()
    gpus = list(sized.gpus.order_by("index"))
    ending = make_active_booking(gpus[:1], cpus=80)
    Allocation.objects.filter(booking=ending).update(end=now + timedelta(minutes=10))
    later = BookingFactory(state=Booking.State.PLANNED, cpus=80)
    AllocationFactory(
        booking=later, gpu=gpus[1], start=now + timedelta(minutes=20), end=now + timedelta(hours=2)
    )
    fits = partial(
        resources_fit,
        booking_id=0,
        asked=(16, 1024),
        devices=[(sized.pk, 1.0)],
        policy=scheduler_policy(),
    )
    # 80 + 16 cores at first, then 80 + 16 again: never more than 96 at once.
    assert fits(during=(now, now + timedelta(hours=1)))
    assert not fits(during=(now, now + timedelta(hours=1)), asked=(17, 1024))


@pytest.mark.both_databases
def test_it_counts_gpus_alone_and_refuses_cores_asked_where_the_site_books_none(
    api, post_booking, project, sized, settings
):
    settings.SCHEDULE_CORES_MEMORY = False  # a site that books GPUs alone
    for body, field in (({"cpus": 8}, "cpus"), ({"memory_mib": "64G"}, "memory_mib")):
        response = post_booking(gpus=1, duration_s=3600, **body)
        assert response.status_code == 400, response.json()
        assert "SCHEDULE_CORES_MEMORY" in str(error_of(response)["fields"][field])
    assert not Booking.objects.exists()
    response = post_booking(gpus=2, duration_s=3600)
    detail = api.get(f"/api/v1/bookings/{response.json()['id']}/").json()
    assert detail["state"] == "active" and detail["held"] == []  # the node's cores not counted
    assert snapshot_take(now=timezone.now()).state.node_resources == {}
    (job,) = agent_desired(node_id=sized.pk).bookings
    assert (job.cpus, job.memory_mib) == (None, None)  # no limits on the job


@pytest.mark.both_databases
def test_it_refuses_a_booking_past_its_projects_limit_of_cores_with_409(
    post_booking, project, sized
):
    project.quotas.update(max_cpus=16)
    response = post_booking(gpus=1, duration_s=3600, cpus=32)
    assert response.status_code == 409, response.json()
    error = error_of(response)
    assert "cpus" in error["fields"], error
    assert "quota allows 16 at once" in error["fields"]["cpus"], error
    assert not Booking.objects.exists()


@pytest.mark.both_databases
def test_it_queues_a_booking_its_projects_cores_in_use_hold_back_with_reason_quota(
    api, post_booking, project, sized, user
):
    project.quotas.update(max_cpus=16)
    gpus = list(sized.gpus.order_by("index"))
    make_active_booking(gpus[:1], owner=user, project=project, cpus=12)
    response = post_booking(gpus=1, duration_s=3600, cpus=8)
    assert response.status_code == 201, response.json()
    detail = api.get(f"/api/v1/bookings/{response.json()['id']}/").json()
    # The node has the GPUs and 84 cores free; the project's limit has 4 of 16 left.
    assert detail["state"] == "pending", detail
    assert detail["pending_reason"] == "quota", detail
    assert "12 of 16 cores in use, needs 8" in detail["state_detail"], detail


def test_it_books_cores_and_memory_by_default(tmp_path):
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "SCHEDULE_CORES_MEMORY"}
    env |= {"DJANGO_SETTINGS_MODULE": "portal.settings", "DEBUG": "1"}
    code = "import portal.settings as s; print(s.SCHEDULE_CORES_MEMORY)"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.stdout.strip() == "True", out.stderr


def _window(hours_from_now: float, hours: float = 1.0) -> dict:
    start = timezone.now().replace(microsecond=0) + timedelta(hours=hours_from_now)
    return {"start": start.isoformat(), "end": (start + timedelta(hours=hours)).isoformat()}


@pytest.mark.both_databases
def test_it_places_a_reservation_only_where_its_cores_fit_in_the_window(
    post_booking, project, sized
):
    first = post_booking(gpus=2, cpus=80, **_window(2))
    assert first.status_code == 201, first.json()
    # The node's other 6 GPUs are free in that window, but 16 of its 96 cores are.
    refused = post_booking(gpus=2, cpus=32, **_window(2.5))
    assert refused.status_code == 409, refused.json()
    error = error_of(refused)
    assert error["code"] == "no_capacity" and "cpus" in error["fields"], error
    assert "not the cores" in error["message"], error
    assert Booking.objects.count() == 1
    # After the first one's window, the cores are free again.
    assert post_booking(gpus=2, cpus=32, **_window(3)).status_code == 201
    # A second node with room: the same request goes there.
    other = _sized(make_node("gpu-b01", gpus=4), cpus=48, memory_mib=512 * 1024)
    moved = post_booking(gpus=2, cpus=32, **_window(2.5))
    assert moved.status_code == 201, moved.json()
    held = Allocation.objects.filter(booking_id=moved.json()["id"]).values_list(
        "gpu__node_id", flat=True
    )
    assert set(held) == {other.pk}


@pytest.mark.both_databases
def test_it_refuses_a_reservation_past_its_projects_limit_of_cores_in_the_window(
    post_booking, project, sized
):
    project.quotas.update(max_cpus=48)
    assert post_booking(gpus=1, cpus=32, **_window(2)).status_code == 201
    refused = post_booking(gpus=1, cpus=32, **_window(2.5))
    assert refused.status_code == 409, refused.json()
    error = error_of(refused)
    assert error["code"] == "quota" and error["limit"] == "max_cpus", error
    assert "32 of 48 cores in that window" in error["fields"]["cpus"], error
    assert Booking.objects.count() == 1
    assert post_booking(gpus=1, cpus=32, **_window(3)).status_code == 201  # after it: room


@pytest.mark.both_databases
def test_it_refuses_an_extension_into_cores_another_booking_holds_then(
    api, post_booking, project, sized, user
):
    gpus = list(sized.gpus.order_by("index"))
    running = make_active_booking(gpus[6:], owner=user, project=project, cpus=48)
    end = Allocation.objects.filter(booking=running).first().end
    later = {"start": end.isoformat(), "end": (end + timedelta(hours=1)).isoformat()}
    # From its end, another booking takes two other GPUs of the node and 64 of its 96 cores.
    assert post_booking(gpus=2, cpus=64, **later).status_code == 201
    response = api.post(f"/api/v1/bookings/{running.pk}/extend/", {"by_s": 1800}, format="json")
    assert response.status_code == 409, response.json()
    error = error_of(response)
    assert "by_s" in error["fields"] and "cores" in error["message"], error
    assert Allocation.objects.filter(booking=running).first().end == end


@pytest.mark.both_databases
def test_it_refuses_an_extension_past_its_projects_limit_of_cores(
    api, post_booking, project, sized, user
):
    project.quotas.update(max_cpus=64)
    gpus = list(sized.gpus.order_by("index"))
    running = make_active_booking(gpus[7:], owner=user, project=project, cpus=32)
    end = Allocation.objects.filter(booking=running).first().end
    later = {"start": end.isoformat(), "end": (end + timedelta(hours=1)).isoformat()}
    assert post_booking(gpus=1, cpus=40, **later).status_code == 201
    response = api.post(f"/api/v1/bookings/{running.pk}/extend/", {"by_s": 1800}, format="json")
    assert response.status_code == 409, response.json()
    error = error_of(response)
    assert error["limit"] == "max_cpus" and "by_s" in error["fields"], error
    ok = api.post(f"/api/v1/bookings/{running.pk}/extend/", {"by_s": 0}, format="json")
    assert ok.status_code == 400  # and nothing changed
    assert Allocation.objects.filter(booking=running).first().end == end


@pytest.mark.both_databases
def test_it_rechecks_a_reservations_cores_under_the_node_lock(
    post_booking, project, sized, monkeypatch
):
    from portal.services.inventory import placement

    window = _window(2)
    start, end = (timezone.datetime.fromisoformat(window[k]) for k in ("start", "end"))
    gpus = list(sized.gpus.order_by("index"))
    place, taken = placement.devices_for_window, []

    def another_takes_the_cores_meanwhile(**kwargs):
        found = place(**kwargs)
        if not taken:  # placed on a free node; then another booking takes 80 of its cores
            other = BookingFactory(state=Booking.State.PLANNED, start=start, end=end, cpus=80)
            for gpu in gpus[6:]:
                AllocationFactory(booking=other, gpu=gpu, start=start, end=end)
            taken.append(other)
        return found

    monkeypatch.setattr(placement, "devices_for_window", another_takes_the_cores_meanwhile)
    refused = post_booking(gpus=2, cpus=32, **window)
    assert refused.status_code == 409, refused.json()
    assert "cpus" in error_of(refused)["fields"], refused.json()
    assert Booking.objects.count() == 1  # the other one only
