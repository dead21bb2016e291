"""The queue around a maintenance window as a user sees it, on both databases."""

from datetime import timedelta

import pytest
from django.utils import timezone

from portal.models import Gpu, MaintenanceWindow, Node
from portal.services.allocation.allocation import allocation_pass
from portal.services.fleet.maintenance import WindowSpec, maintenance_create, maintenance_cycle
from tests.factories import UserFactory, make_node

pytestmark = [pytest.mark.django_db, pytest.mark.both_databases]


@pytest.fixture(autouse=True)
def _after_commit(django_capture_on_commit_callbacks, project):
    global _commits
    _commits = django_capture_on_commit_callbacks
    project.quotas.update(max_gpus=None)


def _submit(api, **body):
    with _commits(execute=True):
        response = api.post("/api/v1/bookings/", body, format="json")
    assert response.status_code == 201, response.json()
    return api.get(f"/api/v1/bookings/{response.json()['id']}/").json()


def _apart(text: str, moment) -> float:
    return abs((timezone.datetime.fromisoformat(text) - moment).total_seconds())


def _window(nodes, start, end, reason="PSU swap") -> MaintenanceWindow:
    staff = UserFactory(username="ops", is_staff=True, is_superuser=True)
    spec = WindowSpec(nodes=tuple(nodes), network_group="", start=start, end=end, reason=reason)
    with _commits(execute=True):
        window, _ = maintenance_create(actor=staff, spec=spec, now=timezone.now())
    return window


def test_it_keeps_a_long_booking_off_a_windows_node_and_moves_a_planned_start(api, cluster):
    now = timezone.now()
    window = _window(["node-a"], now + timedelta(hours=1), now + timedelta(hours=3))
    # A short booking fits on node-a before the window; a long one goes to node-b.
    short = _submit(api, gpus=8, duration_s=1800)
    long = _submit(api, gpus=8, duration_s=4 * 3600)
    assert short["state"] == long["state"] == "active"
    assert {d["node"] for d in short["devices"]} == {"node-a"}
    assert {d["node"] for d in long["devices"]} == {"node-b"}
    # The next long one would cross the window's start on node-a: planned at its end, and
    # the estimate of it says so before it is submitted.
    estimate = api.post(
        "/api/v1/bookings/estimate/", {"gpus": 8, "duration_s": 2 * 3600}, format="json"
    ).json()
    assert estimate["pending_reason"] == "maintenance"
    assert estimate["state_detail"].startswith(f"maintenance window {window.pk} (PSU swap)")
    assert _apart(estimate["planned_start"], window.end) < 5
    moved = _submit(api, gpus=8, duration_s=2 * 3600)
    assert moved["state"] == "pending"
    assert moved["pending_reason"] == "maintenance"
    assert moved["state_detail"].startswith(f"maintenance window {window.pk} (PSU swap) on node-a")
    assert _apart(moved["planned_start"], window.end) < 5


def test_it_plans_on_a_drained_node_from_the_windows_end_and_starts_it_after(api, cluster):
    now = timezone.now()
    Node.objects.filter(hostname="node-b").update(state=Node.State.DOWN)
    window = _window(["node-a"], now - timedelta(minutes=1), now + timedelta(hours=2))
    maintenance_cycle(now=now)
    assert Node.objects.get(hostname="node-a").state == Node.State.MAINTENANCE
    waiting = _submit(api, gpus=2, duration_s=600)
    assert (waiting["state"], waiting["pending_reason"]) == ("pending", "maintenance")
    assert _apart(waiting["planned_start"], window.end) < 5
    later = window.end + timedelta(seconds=1)
    maintenance_cycle(now=later)
    assert Node.objects.get(hostname="node-a").state == Node.State.UP
    allocation_pass(now=later)
    assert api.get(f"/api/v1/bookings/{waiting['id']}/").json()["state"] == "active"


def test_it_refuses_a_reservation_across_a_window_and_places_one_beside_it(api, cluster):
    now = timezone.now()
    _window(["node-a", "node-b"], now + timedelta(hours=1), now + timedelta(hours=2))
    start = now + timedelta(minutes=30)
    across = {
        "gpus": 1,
        "start": start.isoformat(),
        "end": (start + timedelta(hours=1)).isoformat(),
    }
    assert api.post("/api/v1/bookings/", across, format="json").status_code == 409
    before = {
        "gpus": 1,
        "start": start.isoformat(),
        "end": (start + timedelta(minutes=30)).isoformat(),
    }
    with _commits(execute=True):
        assert api.post("/api/v1/bookings/", before, format="json").status_code == 201


def test_it_keeps_fractions_off_a_window_on_their_shared_gpus(api, db):
    node = make_node("node-s", gpus=1)
    Gpu.objects.filter(node=node).update(sharing=Gpu.Sharing.SHARED)
    now = timezone.now()
    window = _window(["node-s"], now + timedelta(hours=1), now + timedelta(hours=2))
    # A quarter that ends before the window starts now; one that would cross it waits for its end.
    short = _submit(api, gpu_fraction=0.25, duration_s=1800)
    assert short["state"] == "active"
    moved = _submit(api, gpu_fraction=0.25, duration_s=2 * 3600)
    assert (moved["state"], moved["pending_reason"]) == ("pending", "maintenance")
    assert moved["state_detail"].startswith(f"maintenance window {window.pk} (PSU swap) on node-s")
    assert _apart(moved["planned_start"], window.end) < 5
    # A reservation of a fraction across the window is refused; one before it is placed.
    start = now + timedelta(minutes=30)
    across = {"gpu_fraction": 0.25, "start": start.isoformat()}
    across["end"] = (start + timedelta(hours=1)).isoformat()
    assert api.post("/api/v1/bookings/", across, format="json").status_code == 409
    before = {**across, "end": (start + timedelta(minutes=30)).isoformat()}
    with _commits(execute=True):
        assert api.post("/api/v1/bookings/", before, format="json").status_code == 201
