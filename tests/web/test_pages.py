"""Browser pages: status codes, what they show, who may see and change what."""

from datetime import timedelta

import pytest
from django.utils import timezone

from portal.models import Booking
from portal.services.inventory.telemetry_cache import latest_store
from tests.bounded import measured
from tests.factories import (
    AllocationFactory,
    BookingFactory,
    ProjectFactory,
    UserFactory,
    make_mig_gpu,
    make_node,
    member,
)

PAGES = ["/", "/bookings/", "/book/", "/calendar/", "/projects/vision/"]


@pytest.fixture
def client_in(client, user, project):
    client.force_login(user)
    return client


def _active(owner, project, gpu, hours=2):
    now = timezone.now()
    booking = BookingFactory(
        owner=owner, project=project, state=Booking.State.ACTIVE, started_at=now
    )
    AllocationFactory(booking=booking, gpu=gpu, start=now, end=now + timedelta(hours=hours))
    return booking


def reading(**values):
    base = {
        "utilization_gpu": 42.0,
        "utilization_memory": 10.0,
        "memory_used_mib": 2048,
        "memory_total_mib": 81920,
        "temperature_c": 55.0,
        "power_w": 250.0,
        "processes": [],
        "time": timezone.now().isoformat(),
    }
    return base | values


@pytest.mark.parametrize("path", PAGES)
def test_it_sends_anonymous_visitors_to_sign_in(client, db, path):
    response = client.get(path)
    assert response.status_code == 302
    assert response["Location"].startswith("/accounts/login/")


@pytest.mark.parametrize("path", PAGES)
def test_it_renders_every_page_for_a_member(client_in, cluster, path):
    response = client_in.get(path)
    assert response.status_code == 200
    assert b'data-live-url="/ws/live/"' in response.content


def test_it_renders_the_sign_in_page(client, db):
    response = client.get("/accounts/login/")
    assert response.status_code == 200
    assert b'<label for="id_username">' in response.content


def test_it_shows_devices_with_owner_and_live_reading(client_in, user, project, cluster):
    gpu = cluster[0].gpus.order_by("index").first()
    booking = _active(user, project, gpu)
    latest_store({gpu.uuid: reading(utilization_gpu=73.0)})
    body = client_in.get("/").content.decode()
    assert f'data-uuid="{gpu.uuid}"' in body
    assert "73 %" in body
    assert f'href="/bookings/{booking.pk}/"' in body
    assert "no reading yet" in body  # the other GPUs have not reported


def test_it_says_not_measured_for_mig_utilization(client_in, cluster):
    gpu = make_mig_gpu(cluster[0], 8)
    mig = gpu.mig_instances.first()
    latest_store({mig.uuid: reading(utilization_gpu=None, memory_total_mib=40960)})
    body = client_in.get("/").content.decode()
    row = body.split(f'data-uuid="{mig.uuid}"', 1)[1].split("</tr>", 1)[0]
    assert "not measured" in row
    assert "0 %" not in row


def test_it_filters_devices_by_node_and_state(client_in, user, project, cluster):
    _active(user, project, cluster[1].gpus.get(index=0))
    body = client_in.get("/?node=node-b&state=booked").content.decode()
    assert "node-b/gpu0" in body
    assert "node-b/gpu1" not in body
    assert "node-a/gpu0" not in body


def test_it_shows_why_my_pending_request_waits(client_in, user, project, cluster):
    start = timezone.now() + timedelta(hours=3)
    BookingFactory(
        owner=user,
        project=project,
        gpus=4,
        planned_start=start,
        queue_position=2,
        pending_reason="priority",
    )
    body = client_in.get("/?fragment=mine").content.decode()
    assert "position 2 in queue" in body
    assert start.strftime("%H:%M") in body
    assert "higher priority" in body


def test_it_renders_fragments_and_refuses_unknown_ones(client_in, cluster):
    assert client_in.get("/?fragment=devices").status_code == 200
    assert b"<html" not in client_in.get("/?fragment=totals").content
    assert client_in.get("/?fragment=nope").status_code == 404


def test_it_hides_someone_elses_booking(client_in, project, cluster):
    stranger = UserFactory(username="mallory")
    other = ProjectFactory(slug="other")
    member(stranger, other)
    booking = _active(stranger, other, cluster[0].gpus.first())
    assert client_in.get(f"/bookings/{booking.pk}/").status_code == 404
    assert client_in.post(f"/bookings/{booking.pk}/cancel/").status_code == 404
    booking.refresh_from_db()
    assert booking.state == Booking.State.ACTIVE


def test_it_cancels_a_booking_by_post(client_in, user, project, cluster):
    booking = _active(user, project, cluster[0].gpus.first())
    response = client_in.post(f"/bookings/{booking.pk}/cancel/", {"next": "/bookings/"})
    assert response.status_code == 302
    assert response["Location"] == "/bookings/"
    booking.refresh_from_db()
    assert booking.state == Booking.State.CANCELLED


def test_it_refuses_cancel_by_get(client_in, user, project, cluster):
    booking = _active(user, project, cluster[0].gpus.first())
    assert client_in.get(f"/bookings/{booking.pk}/cancel/").status_code == 405


def test_it_shows_a_refused_release_as_a_message(client_in, user, project, cluster):
    booking = BookingFactory(owner=user, project=project)  # pending: cannot be released
    response = client_in.post(f"/bookings/{booking.pk}/release/", follow=True)
    assert "cannot be released" in response.content.decode()


def test_it_extends_an_active_booking(client_in, user, project, cluster):
    booking = _active(user, project, cluster[0].gpus.first(), hours=2)
    client_in.post(f"/bookings/{booking.pk}/extend/", {"by_hours": "4"})
    allocation = booking.allocations.get()
    assert allocation.end - allocation.start == timedelta(hours=6)


def test_it_shows_how_to_use_an_active_booking(client_in, user, project, cluster):
    gpu = cluster[0].gpus.first()
    booking = _active(user, project, gpu)
    body = client_in.get(f"/bookings/{booking.pk}/").content.decode()
    assert f"CUDA_VISIBLE_DEVICES={gpu.uuid}" in body
    assert "node-a" in body
    assert "No history yet" in body or "Efficiency" in body


def test_it_books_a_reservation_from_the_form(client_in, project, cluster):
    start = timezone.now() + timedelta(hours=1)
    response = client_in.post(
        "/book/",
        {
            "project": "vision",
            "kind": "gpus",
            "gpus": "2",
            "when": "window",
            "start": start.strftime("%Y-%m-%dT%H:%M"),
            "end": (start + timedelta(hours=2)).strftime("%Y-%m-%dT%H:%M"),
            "qos": "normal",
        },
    )
    booking = Booking.objects.get()
    assert response.status_code == 302
    assert response["Location"] == f"/bookings/{booking.pk}/"
    assert booking.state == Booking.State.PLANNED
    assert booking.allocations.count() == 2


def test_it_books_gpus_of_any_mix_of_models_only_when_the_box_is_ticked(
    client_in, project, django_capture_on_commit_callbacks
):
    project.quotas.update(max_gpus=None)
    make_node("a1"), make_node("h1", model="H100-80GB")
    form = {"project": "vision", "kind": "gpus", "gpus": "16", "when": "asap", "qos": "normal"}
    page = client_in.get("/book/").content.decode()
    assert 'name="mixed_models"' in page and "Any one model" in page
    refused = client_in.post("/book/", {**form, "duration_hours": "1"})
    assert refused.status_code == 400
    assert "of one model" in refused.content.decode()
    with django_capture_on_commit_callbacks(execute=True):  # the pass, as after a real commit
        response = client_in.post("/book/", {**form, "duration_hours": "1", "mixed_models": "on"})
    assert response.status_code == 302, response.content.decode()[:2000]
    booking = Booking.objects.get()
    assert booking.mixed_models is True and booking.state == Booking.State.ACTIVE
    assert set(booking.allocations.values_list("gpu__model", flat=True)) == {
        "A100-80GB",
        "H100-80GB",
    }


def test_it_books_a_fraction_only_where_a_gpu_is_shared(
    client_in, project, cluster, django_capture_on_commit_callbacks
):
    from portal.models import Gpu

    assert "A fraction of a shared GPU" not in client_in.get("/book/").content.decode()
    shared = cluster[0].gpus.get(index=7)
    Gpu.objects.filter(pk=shared.pk).update(sharing=Gpu.Sharing.SHARED)
    page = client_in.get(f"/gpus/{shared.pk}/").content.decode()
    assert "fractions of it go to several bookings" in page
    body = client_in.get("/").content.decode()
    row = body.split(f'data-uuid="{shared.uuid}"', 1)[1].split("</tr>", 1)[0]
    assert "· shared" in row
    other = body.split(f'data-uuid="{cluster[0].gpus.get(index=6).uuid}"', 1)[1]
    assert "· shared" not in other.split("</tr>", 1)[0]
    form = {"project": "vision", "kind": "shared", "when": "asap", "qos": "normal"}
    assert "A fraction of a shared GPU" in client_in.get("/book/").content.decode()
    empty = client_in.post("/book/", {**form, "duration_hours": "1"})
    assert empty.status_code == 400
    assert "Give a share of the GPU or the memory it needs" in empty.content.decode()
    too_much = client_in.post("/book/", {**form, "duration_hours": "1", "gpu_memory_gib": "100"})
    assert too_much.status_code == 400 and "the largest shared GPU has" in too_much.content.decode()
    with django_capture_on_commit_callbacks(execute=True):
        response = client_in.post("/book/", {**form, "duration_hours": "1", "gpu_fraction": "0.5"})
    assert response.status_code == 302, response.content.decode()[:2000]
    booking = Booking.objects.get()
    assert booking.gpu_fraction == 0.5 and booking.state == Booking.State.ACTIVE
    assert list(booking.allocations.values_list("gpu_id", "share")) == [(shared.pk, 0.5)]


def test_it_books_an_array_after_another_booking_from_the_form(client_in, user, project, cluster):
    first = BookingFactory(owner=user, project=project, state=Booking.State.ACTIVE)
    form = {"project": "vision", "kind": "gpus", "gpus": "1", "when": "asap", "qos": "normal"}
    response = client_in.post(
        "/book/",
        {
            **form,
            "duration_hours": "1",
            "command": "python sweep.py",
            "array": "0-3%2",
            "after": f"afterany:{first.pk}",
        },
    )
    assert response.status_code == 302, response.content.decode()[:2000]
    tasks = Booking.objects.exclude(pk=first.pk).order_by("array_task_id")
    assert [t.array_task_id for t in tasks] == [0, 1, 2, 3]
    assert {t.state for t in tasks} == {Booking.State.PENDING}
    assert all(t.dependencies.get().target_id == first.pk for t in tasks)
    refused = client_in.post("/book/", {**form, "duration_hours": "1", "array": "0-3"})
    assert refused.status_code == 400
    field = refused.content.decode().split('data-field="array"', 1)[1].split('data-field="', 1)[0]
    assert "command per task" in field


def test_it_refuses_a_huge_array_range_from_the_form_without_building_it(
    client_in, project, cluster
):
    form = {"project": "vision", "kind": "gpus", "gpus": "1", "when": "asap", "qos": "normal"}
    form |= {"duration_hours": "1", "command": "python sweep.py"}
    client_in.post("/book/", {**form, "array": "0-5000"})  # imports and caches warm
    with measured() as cost:
        refused = client_in.post("/book/", {**form, "array": "0-99999999999999999999"})
    assert refused.status_code == 400
    field = refused.content.decode().split('data-field="array"', 1)[1].split('data-field="', 1)[0]
    assert "An array has at most 1000 tasks" in field
    assert cost.cheap(), cost
    assert not Booking.objects.exists()


def test_it_shows_form_errors_at_the_field(client_in, project, cluster):
    response = client_in.post(
        "/book/",
        {"project": "vision", "kind": "gpus", "gpus": "0", "when": "asap", "qos": "normal"},
    )
    assert response.status_code == 400
    body = response.content.decode()
    field = body.split('data-field="gpus"', 1)[1].split('data-field="', 1)[0]
    assert 'id="id_gpus_error"' in field
    assert 'aria-invalid="true"' in field
    assert Booking.objects.count() == 0


@pytest.mark.parametrize("gpus", ["0", "", "two"])
def test_it_names_the_gpus_field_once_in_its_error(client_in, project, cluster, gpus):
    response = client_in.post(
        "/book/",
        {"project": "vision", "kind": "gpus", "gpus": gpus, "when": "asap", "qos": "normal"},
    )
    assert response.status_code == 400
    error = response.content.decode().split('id="id_gpus_error">', 1)[1].split("</p>", 1)[0]
    assert error == "Number of GPUs: give a whole number, at least 1."


def test_it_shows_service_refusals_at_the_field(client_in, project, cluster):
    response = client_in.post(
        "/book/",
        {
            "project": "vision",
            "kind": "gpus",
            "gpus": "99",
            "when": "asap",
            "duration_hours": "1",
            "qos": "normal",
        },
    )
    assert response.status_code == 400
    field = response.content.decode().split('data-field="gpus"', 1)[1].split("</div>", 1)[0]
    assert "the cluster has 16" in field


def test_it_prefills_the_form_from_a_calendar_slot(client_in, cluster):
    body = client_in.get(
        "/book/?start=2030-01-07T09:00&end=2030-01-07T13:00&gpu_model=A100-80GB"
    ).content.decode()
    assert 'value="2030-01-07T09:00"' in body
    assert 'value="window" id="id_when_1" required checked' in body


def test_it_draws_bookings_on_the_calendar(client_in, user, project, cluster):
    booking = _active(user, project, cluster[0].gpus.first())
    body = client_in.get("/calendar/").content.decode()
    assert f'href="/bookings/{booking.pk}/"' in body
    assert "tl-bar state-active" in body
    assert "/book/?start=" in body


@pytest.mark.parametrize("week", ["garbage", "9999-12-31", "0001-01-01", "0001-01-03"])
def test_it_shows_this_week_for_a_week_it_cannot_show(client_in, cluster, week):
    response = client_in.get(f"/calendar/?week={week}")
    assert response.status_code == 200
    monday = timezone.now().date() - timedelta(days=timezone.now().weekday())
    assert f"?week={monday + timedelta(days=7):%Y-%m-%d}" in response.content.decode()


def test_it_shows_a_gpu_with_not_measured_mig_utilization(client_in, cluster):
    gpu = make_mig_gpu(cluster[0], 8)
    mig = gpu.mig_instances.first()
    body = client_in.get(f"/gpus/{gpu.pk}/?slice={mig.pk}&range=day").content.decode()
    assert mig.uuid in body
    assert "not measured" in body.lower()


def test_it_links_only_the_gpus_bookings_i_may_see(client_in, user, project, cluster):
    gpu, other_gpu = cluster[0].gpus.all()[:2]
    mine = _active(user, project, gpu)
    theirs = BookingFactory(owner=UserFactory(), project=project, state=Booking.State.PLANNED)
    later = timezone.now() + timedelta(hours=2)
    AllocationFactory(booking=theirs, gpu=gpu, start=later, end=later + timedelta(hours=1))
    _active(user, project, other_gpu)
    response = client_in.get(f"/gpus/{gpu.pk}/")
    # Only the bookings listed are looked up, not every booking the user may see.
    assert response.context["visible_ids"] == {mine.pk}
    body = response.content.decode()
    assert f'href="/bookings/{mine.pk}/"' in body
    assert f'href="/bookings/{theirs.pk}/"' not in body and f"#{theirs.pk}" in body


def test_it_hides_projects_i_am_not_in(client_in, db):
    ProjectFactory(slug="secret")
    assert client_in.get("/projects/secret/").status_code == 404


def test_it_shows_project_usage_against_limits(client_in, user, project, cluster):
    _active(user, project, cluster[0].gpus.first())
    body = client_in.get("/projects/vision/").content.decode()
    assert "1.0 / 16 GPUs" in body
    assert "alice" in body


def test_it_shows_a_bookings_efficiency_and_charts(client_in, user, project, cluster):
    from portal.models import Sample

    gpu = cluster[0].gpus.first()
    booking = _active(user, project, gpu)
    booking.started_at = timezone.now() - timedelta(minutes=30)
    booking.save()
    for minutes, utilization in [(20, 30.0), (10, 70.0)]:
        Sample.objects.create(
            node=gpu.node,
            uuid=gpu.uuid,
            time=timezone.now() - timedelta(minutes=minutes),
            utilization_gpu=utilization,
            memory_used_mib=1024,
            memory_total_mib=81920,
        )
    body = client_in.get(f"/bookings/{booking.pk}/").content.decode()
    assert "<strong>50.0 %</strong> mean utilization" in body
    assert 'id="chart-utilization_gpu"' in body


def _queries(client, path) -> int:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    with CaptureQueriesContext(connection) as queries:
        assert client.get(path).status_code == 200
    return len(queries)


@pytest.mark.parametrize("path", ["/", "/bookings/"])
def test_it_renders_a_list_page_in_queries_that_do_not_grow_with_the_site(
    client_in, user, project, path
):
    from tests.factories import make_node

    gpus = list(make_node("q-a").gpus.all())
    for gpu in gpus[:2]:
        _active(user, project, gpu)
    small = _queries(client_in, path)
    gpus += [g for name in ("q-b", "q-c") for g in make_node(name).gpus.all()]
    for gpu in gpus[2:20]:  # 3 nodes x 8 GPUs, 20 bookings, some by others in the project
        _active(user if gpu.index % 2 else UserFactory(), project, gpu)
    assert _queries(client_in, path) <= small


def test_it_keeps_calendar_filters_with_odd_characters_in_the_week_links(client_in, cluster):
    from tests.factories import make_node

    make_node("lab&co", gpus=1, model="A100+NVL")
    body = client_in.get("/calendar/", {"model": "A100+NVL", "node": "lab&co"}).content.decode()
    assert "?week=" in body and "&amp;model=A100%2BNVL&amp;node=lab%26co" in body


def test_it_charts_a_custom_range_with_the_bookings_on_the_gpu_shaded(
    client_in, user, project, cluster
):
    from portal.models import Sample

    gpu = cluster[0].gpus.get(index=0)
    booking = _active(user, project, gpu)
    now = timezone.now()
    Sample.objects.bulk_create(
        Sample(node=cluster[0], uuid=gpu.uuid, time=now - timedelta(minutes=m), power_w=100.0)
        for m in range(5)
    )
    start = (now - timedelta(hours=2)).strftime("%Y-%m-%dT%H:%M")
    page = client_in.get(f"/gpus/{gpu.pk}/", {"range": "custom", "from": start}).content.decode()
    # Shown back as UTC in 24-hour form, whichever form it came in.
    assert f'name="from" value="{start.replace("T", " ")}"' in page
    assert '"shapes": [{"type": "rect"' in page and f"#{booking.pk} alice" in page
    bad = client_in.get(f"/gpus/{gpu.pk}/", {"range": "custom", "from": "soon"})
    assert bad.status_code == 200 and "From and to are dates and times." in bad.content.decode()


def test_it_asks_for_times_as_utc_24_hour_text_not_a_locale_picker(client_in, project, cluster):
    page = client_in.get("/book/").content.decode()
    assert "datetime-local" not in page
    assert 'name="start"' in page and 'placeholder="YYYY-MM-DD HH:MM"' in page
    assert "Start (UTC)" in page and "24-hour" in page
    gpu_page = client_in.get(f"/gpus/{cluster[0].gpus.first().pk}/").content.decode()
    assert "datetime-local" not in gpu_page and "From (UTC)" in gpu_page

    start = (timezone.now() + timedelta(hours=1)).replace(second=0, microsecond=0)
    response = client_in.post(
        "/book/",
        {
            "project": "vision",
            "kind": "gpus",
            "gpus": "1",
            "when": "window",
            "start": start.strftime("%Y-%m-%d %H:%M"),
            "end": (start + timedelta(hours=2)).strftime("%Y-%m-%d %H:%M"),
            "qos": "normal",
        },
    )
    assert response.status_code == 302
    assert Booking.objects.get().start == start
