"""Project reservations: the API (codes and bodies, each 400), the pass and the estimate on both
databases, the calendar lane and the reserved-but-unused accounting."""

from datetime import timedelta

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from portal.models import Allocation, Booking, DomainEvent, ProjectReservation
from portal.services.allocation.allocation import allocation_pass
from portal.services.booking.project_reservations import RESERVATION_CHANGED
from tests.conftest import error_of
from tests.factories import (
    AllocationFactory,
    BookingFactory,
    ProjectFactory,
    QuotaFactory,
    UserFactory,
    make_node,
    member,
)

pytestmark = pytest.mark.django_db
URL = "/api/v1/reservations/"


@pytest.fixture
def staff(db):
    client = APIClient()
    client.force_authenticate(UserFactory(username="ops", is_staff=True))
    return client


@pytest.fixture
def outsider(db):
    bob = UserFactory(username="bob")
    other = ProjectFactory(slug="other")
    member(bob, other)
    QuotaFactory(project=other, max_gpus=64)
    client = APIClient()
    client.force_authenticate(bob)
    return client


def _iso(moment):
    return moment.isoformat()


def _reserve(staff, **body):
    now = timezone.now()
    body = {
        "project": "vision",
        "gpus": 8,
        "start": _iso(now - timedelta(minutes=1)),
        "end": _iso(now + timedelta(hours=2)),
        **body,
    }
    return staff.post(URL, {k: v for k, v in body.items() if v is not None}, format="json")


def _book(client, gpus, minutes):
    response = client.post(
        "/api/v1/bookings/", {"gpus": gpus, "duration_s": minutes * 60}, format="json"
    )
    assert response.status_code == 201, response.json()
    return response.json()["id"]


def _state(pk):
    return Booking.objects.get(pk=pk)


def test_it_creates_a_reservation_for_staff_and_shows_it_to_members(staff, api, project, cluster):
    response = _reserve(staff, weekly=True, idle_release_minutes=15, gpu_model="A100-80GB")
    assert response.status_code == 201, response.json()
    body = response.json()
    assert body["project"] == "vision" and body["gpus"] == 8 and body["reserved_gpus"] == 8
    assert body["weekly"] is True and body["idle_release_minutes"] == 15
    assert body["windows"][0]["in_use_now"] == 0
    assert len(body["windows"]) == 4  # the one open now and the next three weeks
    listed = api.get(URL).json()
    assert [r["id"] for r in listed["results"]] == [body["id"]]
    assert api.get(f"{URL}{body['id']}/").status_code == 200


def test_it_hides_other_projects_reservations_and_refuses_non_staff(
    staff, outsider, project, cluster
):
    made = _reserve(staff).json()
    assert outsider.get(URL).json()["results"] == []
    assert outsider.get(f"{URL}{made['id']}/").status_code == 404
    response = outsider.post(URL, {"project": "other", "gpus": 1}, format="json")
    assert response.status_code == 403 and error_of(response)["code"] == "forbidden"
    assert outsider.delete(f"{URL}{made['id']}/").status_code == 403


@pytest.mark.parametrize(
    ("body", "field", "says"),
    [
        ({"end": "start"}, "end", "must be after start"),
        ({"start": -5, "end": -2}, "end", "wholly in the past"),
        ({"start": 0, "end": 24 * 8, "weekly": True}, "weekly", "overlaps itself"),
        ({"nodes": ["node-x"]}, "nodes", "unknown node 'node-x'"),
        ({"project": "nope"}, "project", "no project 'nope'"),
        ({"gpu_model": "H100-80GB"}, "gpu_model", "no GPUs of model 'H100-80GB'"),
        ({"gpus": 9, "nodes": ["node-a"]}, "gpus", "more than the 8 whole GPUs the nodes named"),
        ({"gpus": 17}, "gpus", "more than the 16 whole GPUs the site hold"),
        ({"gpus": None}, "gpus", "name a number of GPUs or the nodes"),
        ({"idle_release_minutes": 0}, "idle_release_minutes", "greater than or equal to 1"),
        ({"color": "red"}, "color", "Unknown field."),
    ],
)
def test_it_refuses_bad_input_naming_the_field(staff, project, cluster, body, field, says):
    now = timezone.now()
    for key in ("start", "end"):
        if isinstance(body.get(key), int):
            body[key] = _iso(now + timedelta(hours=body[key]))
    if body.get("end") == "start":
        body["end"] = body["start"] = _iso(now + timedelta(hours=1))
    response = _reserve(staff, **body)
    assert response.status_code == 400, response.json()
    error = error_of(response)
    assert field in error["fields"] and says in str(error["fields"][field]), error
    assert not ProjectReservation.objects.exists()


@pytest.mark.both_databases
def test_it_holds_reserved_devices_for_members_and_lets_outsiders_use_the_rest(
    staff, api, outsider, project, cluster
):
    assert _reserve(staff, gpus=8).status_code == 201
    wide = _book(outsider, 16, 30)  # needs the reserved GPUs too
    half = _book(outsider, 8, 30)  # fits on the other node
    allocation_pass(now=timezone.now())
    assert _state(half).state == Booking.State.ACTIVE
    waiting = _state(wide)
    assert waiting.state == Booking.State.PENDING
    assert waiting.pending_reason == "project_reservation"
    mine = _book(api, 8, 30)
    allocation_pass(now=timezone.now())
    assert _state(mine).state == Booking.State.ACTIVE
    held = Allocation.objects.filter(booking_id__in=[mine, half], live=True)
    assert len({a.gpu_id for a in held}) == 16  # no device shared


@pytest.mark.both_databases
def test_it_does_not_count_members_bookings_on_the_reservation_against_the_quota(
    staff, api, project, cluster
):
    project.quotas.update(max_gpus=8)
    assert _reserve(staff, gpus=8).status_code == 201
    inside = _book(api, 8, 60)
    allocation_pass(now=timezone.now())
    assert _state(inside).state == Booking.State.ACTIVE
    # The 8 on the reservation are not counted: 8 more fit the limit of 8 at once.
    beyond = _book(api, 8, 60)
    allocation_pass(now=timezone.now())
    assert _state(beyond).state == Booking.State.ACTIVE
    ProjectReservation.objects.all().delete()
    third = _book(api, 1, 60)
    allocation_pass(now=timezone.now())
    assert _state(third).pending_reason == "quota"  # without it, all 16 count


@pytest.mark.both_databases
def test_it_runs_an_outsiders_short_booking_before_the_window(staff, outsider, project, cluster):
    now = timezone.now()
    later = {"start": _iso(now + timedelta(hours=1)), "end": _iso(now + timedelta(hours=3))}
    assert _reserve(staff, gpus=16, **later).status_code == 201
    short = _book(outsider, 16, 30)
    long = _book(outsider, 1, 120)
    allocation_pass(now=timezone.now())
    assert _state(short).state == Booking.State.ACTIVE
    waiting = _state(long)
    assert waiting.pending_reason == "project_reservation"
    assert waiting.planned_start >= now + timedelta(hours=3) - timedelta(seconds=5)


@pytest.mark.both_databases
def test_it_releases_unclaimed_capacity_after_the_idle_time(staff, outsider, project, cluster):
    now = timezone.now()
    window = {"start": _iso(now - timedelta(minutes=30)), "idle_release_minutes": 10}
    assert _reserve(staff, gpus=16, **window).status_code == 201
    wide = _book(outsider, 16, 30)
    allocation_pass(now=timezone.now())
    assert _state(wide).state == Booking.State.ACTIVE


@pytest.mark.both_databases
def test_it_estimates_what_the_pass_decides(staff, outsider, project, cluster):
    assert _reserve(staff, gpus=8).status_code == 201
    body = {"gpus": 16, "duration_s": 1800}
    estimate = outsider.post("/api/v1/bookings/estimate/", body, format="json").json()
    wide = _book(outsider, 16, 30)
    allocation_pass(now=timezone.now())
    stored = _state(wide)
    assert estimate["pending_reason"] == stored.pending_reason == "project_reservation"
    planned = timezone.datetime.fromisoformat(estimate["planned_start"])
    assert abs((planned - stored.planned_start).total_seconds()) < 30


def test_it_replans_after_a_change_and_never_deletes_a_booking(
    staff, outsider, project, cluster, django_capture_on_commit_callbacks
):
    made = _reserve(staff, gpus=8).json()
    wide = _book(outsider, 16, 30)
    allocation_pass(now=timezone.now())
    assert _state(wide).pending_reason == "project_reservation"
    now = timezone.now()
    change = {"project": "vision", "gpus": 8, "start": _iso(now + timedelta(hours=5))}
    change["end"] = _iso(now + timedelta(hours=6))
    with django_capture_on_commit_callbacks(execute=True):
        response = staff.put(f"{URL}{made['id']}/", change, format="json")
    assert response.status_code == 200, response.json()
    facts = DomainEvent.objects.filter(kind=RESERVATION_CHANGED)
    assert [f.payload["change"] for f in facts.order_by("id")] == ["created", "changed"]
    allocation_pass(now=timezone.now())
    assert _state(wide).state == Booking.State.ACTIVE  # 30 minutes end before the new window
    assert staff.delete(f"{URL}{made['id']}/").status_code == 204
    assert Booking.objects.filter(pk=wide).exists()


def test_it_reports_reserved_but_unused_gpu_hours_per_project(staff, user, project, cluster):
    now = timezone.now().replace(microsecond=0)
    start = now - timedelta(hours=3)
    ProjectReservation.objects.create(
        project=project, gpus=2, start=start, end=start + timedelta(hours=2)
    )
    booking = BookingFactory(owner=user, project=project, started_at=start)
    gpu = cluster[0].gpus.order_by("index").first()
    AllocationFactory(
        booking=booking, gpu=gpu, start=start, end=start + timedelta(hours=1), live=False
    )
    query = {"group_by": "project", "from": _iso(now - timedelta(days=1)), "to": _iso(now)}
    rows = staff.get("/api/v1/accounting/", query).json()
    row = next(r for r in rows if r["project"] == "vision")
    assert row["reserved_unused_gpu_hours"] == 3.0  # 4 reserved, 1 used


def test_it_shows_each_reservation_and_its_use_on_the_calendar(
    client, user, staff, project, cluster
):
    assert _reserve(staff, gpus=8, note="class").status_code == 201
    client.force_login(user)
    page = client.get("/calendar/").content.decode()
    assert "Project reservations" in page
    assert "Project reservation " in page and "for vision: 8 GPUs" in page
    assert "used 0.0 of" in page


def test_it_leaves_the_calendar_without_the_lane_when_none_is_visible(client, cluster, db):
    other = ProjectFactory(slug="secret")
    ProjectReservation.objects.create(
        project=other,
        gpus=1,
        start=timezone.now(),
        end=timezone.now() + timedelta(hours=1),
    )
    client.force_login(UserFactory(username="carol"))
    assert "Project reservations" not in client.get("/calendar/").content.decode()


def test_it_refuses_a_reservation_on_a_node_without_gpus_of_the_model(staff, project, cluster):
    make_node("node-h", gpus=2, model="H100-80GB")
    response = _reserve(staff, gpus=None, nodes=["node-a"], gpu_model="H100-80GB")
    assert response.status_code == 400
    assert "no whole GPUs of model H100-80GB" in error_of(response)["fields"]["nodes"]


def _window(client, gpus, start, end):
    body = {"gpus": gpus, "start": _iso(start), "end": _iso(end)}
    return client.post("/api/v1/bookings/", body, format="json")


@pytest.mark.both_databases
def test_it_places_an_outsiders_advance_reservation_around_the_held_devices(
    staff, api, outsider, project, cluster
):
    from portal.services.allocation.snapshot import snapshot_take

    now = timezone.now()
    later = {"start": _iso(now + timedelta(hours=1)), "end": _iso(now + timedelta(hours=3))}
    assert _reserve(staff, gpus=8, **later).status_code == 201
    inside = (now + timedelta(hours=2), now + timedelta(hours=2, minutes=30))
    response = _window(outsider, 8, *inside)
    assert response.status_code == 201, response.json()
    taken = {f"gpu:{a.gpu_id}" for a in Allocation.objects.filter(booking_id=response.json()["id"])}
    (hold,) = snapshot_take(now=timezone.now()).state.holds
    assert len(hold.device_ids) == 8 and not taken & set(hold.device_ids)
    refused = _window(outsider, 1, *inside)  # only the held 8 are left in the window
    assert refused.status_code == 409 and error_of(refused)["code"] == "no_capacity"
    assert _window(api, 8, *inside).status_code == 201  # a member's fits on them


def _admin_form(project, **fields):
    now = timezone.now()
    start, end = now + timedelta(hours=1), now + timedelta(hours=3)
    return {
        "project": project.pk,
        "gpus": 4,
        "gpu_model": "",
        "start_0": start.strftime("%Y-%m-%d"),
        "start_1": start.strftime("%H:%M:%S"),
        "end_0": end.strftime("%Y-%m-%d"),
        "end_1": end.strftime("%H:%M:%S"),
        "weekly": "on",
        "idle_release_minutes": "",
        "note": "class",
        **fields,
    }


def test_it_lets_staff_reserve_in_the_admin_through_the_same_rules(admin_client, project, cluster):
    url = "/admin/portal/projectreservation/add/"
    refused = admin_client.post(url, _admin_form(project, gpus=40))
    assert refused.status_code == 200
    assert "more than the 16 whole GPUs" in refused.content.decode()
    assert not ProjectReservation.objects.exists()
    made = admin_client.post(url, _admin_form(project))
    assert made.status_code == 302, made.content.decode()[:2000]
    reservation = ProjectReservation.objects.get()
    assert reservation.weekly and reservation.gpus == 4
    facts = DomainEvent.objects.filter(kind=RESERVATION_CHANGED)
    assert [f.payload["change"] for f in facts] == ["created"]


@pytest.mark.both_databases
def test_it_tells_an_owner_whose_planned_start_a_change_moved(staff, outsider, project, cluster):
    from portal.models import Notification
    from portal.services.notify.notify_scan import notifications_scan

    now = timezone.now()
    window = {"start": _iso(now + timedelta(hours=1)), "end": _iso(now + timedelta(hours=3))}
    made = _reserve(staff, gpus=16, **window).json()
    wide = _book(outsider, 16, 120)
    allocation_pass(now=timezone.now())
    notifications_scan(now=timezone.now())
    assert Notification.objects.filter(booking_id=wide, event="queued").count() == 1
    longer = {"project": "vision", "gpus": 16, "start": window["start"]}
    longer["end"] = _iso(now + timedelta(hours=6))
    assert staff.put(f"{URL}{made['id']}/", longer, format="json").status_code == 200
    allocation_pass(now=timezone.now())
    assert _state(wide).planned_start >= now + timedelta(hours=6) - timedelta(seconds=5)
    notifications_scan(now=timezone.now())
    moved = Notification.objects.get(booking_id=wide, event="moved")
    assert moved.context["planned_start"] == _state(wide).planned_start.isoformat()
