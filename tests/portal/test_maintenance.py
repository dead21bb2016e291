"""Maintenance windows: the API, the queue around them, the drain and return, who is told."""

from datetime import timedelta

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from portal.models import Booking, Event, MaintenanceWindow, Node, Notification
from portal.services.fleet.maintenance import maintenance_cycle
from tests.conftest import error_of
from tests.factories import UserFactory, make_active_booking

pytestmark = pytest.mark.django_db


@pytest.fixture
def staff_api(db):
    client = APIClient()
    client.force_authenticate(UserFactory(username="ops", is_staff=True, is_superuser=True))
    return client


@pytest.fixture
def commits(django_capture_on_commit_callbacks):
    return django_capture_on_commit_callbacks


def _iso(delta: timedelta) -> str:
    return (timezone.now() + delta).isoformat()


def _window(client, commits, **body):
    body.setdefault("reason", "firmware upgrade")
    body.setdefault("start", _iso(timedelta(hours=1)))
    body.setdefault("end", _iso(timedelta(hours=3)))
    with commits(execute=True):
        return client.post("/api/v1/maintenance/", body, format="json")


def test_it_creates_a_window_and_lists_the_bookings_it_collides_with(staff_api, commits, cluster):
    a = cluster[0]
    running = make_active_booking(list(a.gpus.all()[:2]))  # until an hour from now
    elsewhere = make_active_booking(list(cluster[1].gpus.all()[:1]))
    response = _window(staff_api, commits, nodes=["node-a"], start=_iso(timedelta(minutes=30)))
    assert response.status_code == 201, response.json()
    body = response.json()
    assert body["nodes"] == ["node-a"]
    assert body["state"] == "planned"
    assert [c["id"] for c in body["collisions"]] == [running.pk]
    assert body["collisions"][0]["owner"] == running.owner.username
    assert elsewhere.pk not in [c["id"] for c in body["collisions"]]
    # The owner is told, after commit, through the notification machinery; nobody else.
    told = Notification.objects.filter(event=Event.MAINTENANCE)
    assert [n.booking_id for n in told] == [running.pk]
    assert told[0].context["reason"] == "firmware upgrade"
    assert told[0].deliveries.filter(user=running.owner).exists()
    # It never ends a booking.
    running.refresh_from_db()
    assert running.state == Booking.State.ACTIVE


def test_it_covers_every_node_or_a_network_group(staff_api, commits, cluster):
    Node.objects.filter(hostname="node-b").update(network_group="rack-2")
    everything = _window(staff_api, commits).json()
    assert (everything["nodes"], everything["all_nodes"]) == (["node-a", "node-b"], True)
    rack = _window(staff_api, commits, network_group="rack-2").json()
    assert (rack["nodes"], rack["all_nodes"]) == (["node-b"], False)


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"start": 2, "end": 1}, "end"),  # hours from now
        ({"start": 2, "end": 2}, "end"),
        ({"start": -3, "end": -1}, "end"),  # wholly in the past
        ({"nodes": ["node-a", "no-such-node"]}, "nodes"),
        ({"network_group": "rack-99"}, "network_group"),
        ({"reason": ""}, "reason"),
        ({"nodes": ["n"] * 1001}, "nodes"),
        ({"colour": "red"}, "colour"),
    ],
)
def test_it_refuses_a_bad_window_naming_the_field(staff_api, commits, cluster, body, field):
    now = timezone.now()
    for key in ("start", "end"):
        if key in body:
            body[key] = (now + timedelta(hours=body[key])).isoformat()
    response = _window(staff_api, commits, **body)
    assert response.status_code == 400, response.json()
    assert field in error_of(response)["fields"]
    assert not MaintenanceWindow.objects.exists()


def test_it_lets_everyone_read_and_only_staff_write(api, staff_api, commits, cluster):
    created = _window(staff_api, commits, nodes=["node-a"]).json()
    listed = api.get("/api/v1/maintenance/").json()
    assert [w["id"] for w in listed["results"]] == [created["id"]]
    assert api.get(f"/api/v1/maintenance/{created['id']}/").json()["reason"] == "firmware upgrade"
    assert api.get("/api/v1/maintenance/999/").status_code == 404
    assert _window(api, commits, nodes=["node-a"]).status_code == 403
    path = f"/api/v1/maintenance/{created['id']}/"
    assert api.patch(path, {"reason": "x"}, format="json").status_code == 403
    assert api.delete(path).status_code == 403
    assert MaintenanceWindow.objects.count() == 1


def test_it_drains_the_nodes_at_the_start_and_returns_them_at_the_end(staff_api, commits, cluster):
    _window(
        staff_api,
        commits,
        nodes=["node-a"],
        start=_iso(timedelta(minutes=1)),
        end=_iso(timedelta(hours=1)),
    )
    now = timezone.now()
    assert maintenance_cycle(now=now) is False  # not yet
    assert maintenance_cycle(now=now + timedelta(minutes=2)) is True
    a, b = (Node.objects.get(hostname=h) for h in ("node-a", "node-b"))
    assert (a.state, b.state) == (Node.State.MAINTENANCE, Node.State.UP)
    assert a.state_reason.startswith("maintenance window ")
    # A heartbeat does not bring it back early, and the cycle is idempotent.
    assert maintenance_cycle(now=now + timedelta(minutes=3)) is False
    assert maintenance_cycle(now=now + timedelta(hours=2)) is True
    a.refresh_from_db()
    assert (a.state, a.state_reason) == (Node.State.UP, "")


def test_it_returns_the_nodes_of_a_deleted_window(staff_api, commits, cluster):
    created = _window(staff_api, commits, nodes=["node-a"], start=_iso(-timedelta(minutes=5)))
    maintenance_cycle()
    assert Node.objects.get(hostname="node-a").state == Node.State.MAINTENANCE
    with commits(execute=True):
        response = staff_api.delete(f"/api/v1/maintenance/{created.json()['id']}/")
    assert response.status_code == 204
    maintenance_cycle()
    assert Node.objects.get(hostname="node-a").state == Node.State.UP


def test_it_leaves_a_node_staff_drained_alone(staff_api, commits, cluster):
    Node.objects.filter(hostname="node-a").update(state=Node.State.DRAIN)
    _window(staff_api, commits, nodes=["node-a"], start=_iso(-timedelta(minutes=5)))
    maintenance_cycle()
    assert Node.objects.get(hostname="node-a").state == Node.State.DRAIN


def test_it_tells_the_owners_again_when_a_window_changes(staff_api, commits, cluster):
    running = make_active_booking(list(cluster[1].gpus.all()[:1]))
    created = _window(staff_api, commits, nodes=["node-a"]).json()
    assert created["collisions"] == []
    with commits(execute=True):
        response = staff_api.patch(
            f"/api/v1/maintenance/{created['id']}/",
            {"nodes": ["node-a", "node-b"], "start": _iso(timedelta(minutes=10))},
            format="json",
        )
    assert response.status_code == 200, response.json()
    assert [c["id"] for c in response.json()["collisions"]] == [running.pk]
    assert Notification.objects.filter(event=Event.MAINTENANCE, booking=running).count() == 1
    bad = staff_api.patch(
        f"/api/v1/maintenance/{created['id']}/", {"end": _iso(timedelta(minutes=5))}, format="json"
    )
    assert bad.status_code == 400
    assert "end" in error_of(bad)["fields"]


def _admin_form(start, end, **fields):
    return {
        "reason": "cooling",
        "start_0": start.strftime("%Y-%m-%d"),
        "start_1": start.strftime("%H:%M:%S"),
        "end_0": end.strftime("%Y-%m-%d"),
        "end_1": end.strftime("%H:%M:%S"),
        "network_group": "",
        **fields,
    }


def test_it_creates_a_window_in_the_admin_and_names_the_collisions(admin_client, commits, cluster):
    running = make_active_booking(list(cluster[0].gpus.all()[:1]))
    now = timezone.now()
    form = _admin_form(now + timedelta(minutes=10), now + timedelta(hours=2), nodes=[cluster[0].pk])
    with commits(execute=True):
        response = admin_client.post("/admin/portal/maintenancewindow/add/", form, follow=True)
    assert response.status_code == 200
    text = response.content.decode()
    assert f"{running.pk} ({running.owner.username}, active)" in text
    window = MaintenanceWindow.objects.get()
    assert [n.hostname for n in window.nodes.all()] == ["node-a"]
    assert Notification.objects.filter(event=Event.MAINTENANCE, booking=running).exists()
    listed = admin_client.get("/admin/portal/maintenancewindow/")
    assert listed.status_code == 200
    assert "node-a" in listed.content.decode() and "cooling" in listed.content.decode()
    with commits(execute=True):
        deleted = admin_client.post(
            f"/admin/portal/maintenancewindow/{window.pk}/delete/", {"post": "yes"}
        )
    assert deleted.status_code == 302
    assert not MaintenanceWindow.objects.exists()


def test_it_refuses_a_window_in_the_past_in_the_admin(admin_client, cluster):
    now = timezone.now()
    form = _admin_form(now - timedelta(hours=3), now - timedelta(hours=2))
    response = admin_client.post("/admin/portal/maintenancewindow/add/", form)
    assert response.status_code == 200  # the form again, with the error
    assert "the window lies wholly in the past" in response.content.decode()
    assert not MaintenanceWindow.objects.exists()


def test_it_tells_whose_planned_start_a_window_moves_and_why(
    staff_api, commits, submit, project, cluster
):
    from portal.services.notify.messages import message_build
    from portal.services.notify.notify_scan import notifications_scan

    project.quotas.update(max_gpus=None)
    submit(gpus=16, duration_s=3600)
    waiting = submit(gpus=8, duration_s=2 * 3600)
    notifications_scan(now=timezone.now())
    assert Notification.objects.filter(booking_id=waiting, event=Event.QUEUED).exists()
    window = _window(
        staff_api, commits, start=_iso(timedelta(minutes=90)), end=_iso(timedelta(hours=4))
    ).json()
    booking = Booking.objects.get(pk=waiting)
    assert booking.pending_reason == "maintenance"
    notifications_scan(now=timezone.now())
    moved = Notification.objects.get(booking_id=waiting, event=Event.MOVED)
    message = message_build(moved)
    assert ("Why it waits", booking.state_detail) in message.facts
    assert booking.state_detail.startswith(f"maintenance window {window['id']} (firmware upgrade)")


def test_it_refuses_to_extend_a_booking_into_a_window_on_its_nodes(
    api, staff_api, commits, submit, project, cluster
):
    booking = submit(gpus=2, duration_s=1800)  # on one node, ends in 30 min
    node = Booking.objects.get(pk=booking).allocations.first().gpu.node.hostname
    window = _window(
        staff_api,
        commits,
        nodes=[node],
        start=_iso(timedelta(hours=1)),
        end=_iso(timedelta(hours=2)),
    ).json()
    path = f"/api/v1/bookings/{booking}/extend/"
    assert api.post(path, {"by_s": 1200}, format="json").status_code == 200  # ends before it
    refused = api.post(path, {"by_s": 3600}, format="json")
    assert refused.status_code == 409, refused.json()
    error = error_of(refused)
    assert f"Maintenance window {window['id']} (firmware upgrade)" in error["message"]
    assert "by_s" in error["fields"]


def test_it_starts_nothing_into_a_window_made_after_the_passs_snapshot(api, project, cluster):
    import scheduler
    from portal.services.allocation.pass_start import start_planned
    from portal.services.allocation.snapshot import snapshot_take

    # Submitted without its after-commit pass: it waits for the pass below.
    response = api.post("/api/v1/bookings/", {"gpus": 8, "duration_s": 7200}, format="json")
    assert response.status_code == 201
    now = timezone.now()
    snap = snapshot_take(now=now)
    [start] = scheduler.plan(snap.state, snap.policy).starts
    rows = [snap.devices[device] for device in start.device_ids]
    pending = snap.pending[int(start.booking_id)]
    window = MaintenanceWindow.objects.create(
        reason="late", start=now + timedelta(hours=1), end=now + timedelta(hours=2)
    )  # every node
    assert start_planned(pending=pending, rows=rows, snap=snap, now=now, done=set()) is False
    booking = Booking.objects.get(pk=pending.pk)
    assert (booking.state, booking.allocations.count()) == (Booking.State.PENDING, 0)
    window.delete()
    assert start_planned(pending=pending, rows=rows, snap=snap, now=now, done=set()) is True


def test_it_starts_no_fraction_into_a_window_made_after_the_passs_snapshot(api, project, cluster):
    import scheduler
    from portal.models import Gpu
    from portal.services.allocation.pass_start import start_planned
    from portal.services.allocation.snapshot import share_row, snapshot_take

    Gpu.objects.filter(pk=Gpu.objects.order_by("pk").first().pk).update(sharing=Gpu.Sharing.SHARED)
    body = {"gpu_fraction": 0.25, "duration_s": 7200}
    assert api.post("/api/v1/bookings/", body, format="json").status_code == 201
    now = timezone.now()
    snap = snapshot_take(now=now)
    [start] = scheduler.plan(snap.state, snap.policy).starts
    assert start.share == 0.25
    rows = [share_row(snap.devices[device], start) for device in start.device_ids]
    pending = snap.pending[int(start.booking_id)]
    window = MaintenanceWindow.objects.create(
        reason="late", start=now + timedelta(hours=1), end=now + timedelta(hours=2)
    )  # every node
    assert start_planned(pending=pending, rows=rows, snap=snap, now=now, done=set()) is False
    assert Booking.objects.get(pk=pending.pk).allocations.count() == 0
    window.delete()
    assert start_planned(pending=pending, rows=rows, snap=snap, now=now, done=set()) is True
    assert Booking.objects.get(pk=pending.pk).allocations.get().share == 0.25


def test_it_drains_through_the_periodic_job_of_the_one_beat_schedule(settings, cluster):
    from celery import current_app

    entry = settings.CELERY_BEAT_SCHEDULE["maintenance-cycle"]
    now = timezone.now()
    window = MaintenanceWindow.objects.create(
        reason="now", start=now - timedelta(minutes=1), end=now + timedelta(hours=1)
    )
    window.nodes.set([cluster[1]])
    current_app.loader.import_default_modules()
    current_app.tasks[entry["task"]].apply()  # as manage.py up's in-process beat runs it
    assert Node.objects.get(hostname="node-b").state == Node.State.MAINTENANCE
    assert Node.objects.get(hostname="node-a").state == Node.State.UP
