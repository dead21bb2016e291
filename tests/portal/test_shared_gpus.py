"""Shared GPUs as users and staff see them: fractions packed on one GPU, whole GPUs kept off it,
bad input refused with the field, the mode changed by staff only and never under live bookings
of the other kind, accounting charged by the share. Scheduling scenarios run on both databases."""

from datetime import timedelta

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from portal.models import Allocation, Booking, Gpu
from portal.services.inventory.sharing import share_fits
from tests.conftest import error_of
from tests.factories import (
    AllocationFactory,
    BookingFactory,
    UserFactory,
    make_active_booking,
    make_node,
    member,
)

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _after_commit(django_capture_on_commit_callbacks, project):
    global _commits
    _commits = django_capture_on_commit_callbacks
    project.quotas.update(max_gpus=None)


@pytest.fixture
def site(db):
    """node-a: one exclusive GPU and one shared GPU (80 GiB)."""
    node = make_node("node-a", gpus=2)
    shared = node.gpus.get(index=1)
    Gpu.objects.filter(pk=shared.pk).update(sharing=Gpu.Sharing.SHARED)
    return node.gpus.get(index=0), node.gpus.get(index=1)


@pytest.fixture
def bob(project):
    bob = UserFactory(username="bob")
    member(bob, project)
    client = APIClient()
    client.force_authenticate(bob)
    return client


def _submit(api, **body):
    with _commits(execute=True):
        response = api.post("/api/v1/bookings/", body, format="json")
    assert response.status_code == 201, response.json()
    return response.json()["id"]


def _get(api, booking_id):
    return api.get(f"/api/v1/bookings/{booking_id}/").json()


@pytest.mark.both_databases
def test_it_runs_two_users_quarters_and_a_half_on_one_gpu_and_a_fourth_waits(api, bob, site):
    whole, shared = site
    a = _submit(api, gpu_fraction=0.25, duration_s=3600)
    b = _submit(bob, gpu_fraction=0.25, duration_s=1800)
    c = _submit(api, gpu_fraction=0.5, duration_s=7200)
    d = _submit(bob, gpu_fraction=0.25, duration_s=600)
    rows = [_get(api, a), _get(bob, b), _get(api, c)]
    assert [row["state"] for row in rows] == ["active"] * 3
    assert {row["cuda_visible_devices"] for row in rows} == {shared.uuid}
    assert [row["devices"][0]["share"] for row in rows] == [0.25, 0.25, 0.5]
    assert rows[0]["devices"][0]["gpu_memory_mib"] == 20480
    fourth = _get(bob, d)
    assert (fourth["state"], fourth["pending_reason"]) == ("pending", "resources")
    # It starts when the shortest one there ends (b, 30 minutes).
    planned = timezone.datetime.fromisoformat(fourth["planned_start"])
    ends = timezone.datetime.fromisoformat(rows[1]["end"])
    assert abs((planned - ends).total_seconds()) < 5


@pytest.mark.both_databases
def test_it_never_puts_a_whole_gpu_on_the_shared_one(api, site):
    whole, shared = site
    _submit(api, gpu_fraction=0.25, duration_s=3600)
    first = _get(api, _submit(api, gpus=1, duration_s=3600))
    second = _get(api, _submit(api, gpus=1, duration_s=3600))
    assert first["cuda_visible_devices"] == whole.uuid
    assert (second["state"], second["pending_reason"]) == ("pending", "resources")
    assert not Allocation.objects.filter(gpu=shared, live=True, gpu_memory_mib__isnull=True)


@pytest.mark.both_databases
def test_it_places_a_memory_request_by_its_share_of_the_gpu(api, site):
    booking = _get(api, _submit(api, gpu_memory_mib=40960, duration_s=3600))
    assert booking["state"] == "active"
    assert (booking["gpu_fraction"], booking["gpu_memory_mib"]) == (None, 40960)
    assert booking["devices"][0]["share"] == 0.5
    assert Allocation.objects.get(booking_id=booking["id"]).fraction == 0.5


@pytest.mark.both_databases
def test_it_estimates_a_fraction_beside_the_running_ones(api, site):
    _submit(api, gpu_fraction=0.5, duration_s=3600)
    fits = api.post(
        "/api/v1/bookings/estimate/", {"gpu_fraction": 0.5, "duration_s": 60}, format="json"
    )
    assert fits.status_code == 200, fits.json()
    assert fits.json()["pending_reason"] == "starting"
    waits = api.post(
        "/api/v1/bookings/estimate/", {"gpu_fraction": 0.75, "duration_s": 60}, format="json"
    )
    assert waits.json()["pending_reason"] == "resources"


def test_it_charges_accounting_by_the_share(api, site, project):
    whole, shared = site
    start = timezone.now() - timedelta(hours=3)
    booking = BookingFactory(
        owner=project.memberships.first().user,
        project=project,
        gpu_fraction=0.25,
        state=Booking.State.FINISHED,
        started_at=start,
        ended_at=start + timedelta(hours=2),
    )
    AllocationFactory(
        booking=booking,
        gpu=shared,
        start=start,
        end=start + timedelta(hours=2),
        fraction=0.25,
        share=0.25,
        gpu_memory_mib=20480,
        live=False,
    )
    since = (start - timedelta(hours=1)).isoformat()
    response = api.get("/api/v1/accounting/", {"group_by": "project", "from": since})
    assert response.status_code == 200, response.json()
    (row,) = [r for r in response.json() if r["project"] == project.slug]
    assert row["gpu_hours"] == pytest.approx(0.5)  # 0.25 x 2 hours


@pytest.mark.parametrize(
    ("body", "field", "words"),
    [
        ({"gpu_fraction": 0}, "gpu_fraction", "greater than 0"),
        ({"gpu_fraction": 1}, "gpu_fraction", "less than 1"),
        ({"gpu_fraction": -0.5}, "gpu_fraction", "greater than 0"),
        ({"gpu_memory_mib": 0}, "gpu_memory_mib", "positive"),
        ({"gpu_memory_mib": 90000}, "gpu_memory_mib", "81920 MiB"),
        ({"gpu_fraction": 0.5, "gpus": 2}, "gpus", "one GPU"),
        ({"gpu_fraction": 0.5, "mig_profile": "1g.10gb"}, "mig_profile", "cannot be shared"),
        ({"gpu_fraction": 0.5, "node_count": 1}, "node_count", "one node"),
        ({"gpu_fraction": 0.5, "gpu_model": "H100"}, "gpu_model", "unknown GPU model"),
    ],
)
def test_it_refuses_a_bad_fraction_naming_the_field(api, site, body, field, words):
    response = api.post("/api/v1/bookings/", {"duration_s": 600, **body}, format="json")
    assert response.status_code == 400, response.json()
    error = error_of(response)
    assert field in error["fields"], error
    assert words in error["fields"][field], error
    assert not Booking.objects.exists()


def test_it_refuses_a_fraction_where_no_gpu_is_shared(api, cluster):
    response = api.post(
        "/api/v1/bookings/", {"gpu_fraction": 0.5, "duration_s": 600}, format="json"
    )
    assert response.status_code == 400
    assert "no GPU of this site is shared" in error_of(response)["fields"]["gpu_fraction"]


def _window(hours_from_now: float, hours: float = 1.0) -> dict:
    start = (timezone.now() + timedelta(hours=hours_from_now)).replace(microsecond=0)
    return {"start": start.isoformat(), "end": (start + timedelta(hours=hours)).isoformat()}


@pytest.mark.both_databases
def test_it_reserves_fractions_of_a_shared_gpu_for_a_window(api, bob, site):
    whole, shared = site
    window = _window(2)
    first = _get(api, _submit(api, gpu_fraction=0.5, **window))
    second = _get(bob, _submit(bob, gpu_memory_mib=40960, **window))
    assert first["state"] == second["state"] == "planned"
    assert {first["cuda_visible_devices"], second["cuda_visible_devices"]} == {shared.uuid}
    assert [first["devices"][0]["share"], second["devices"][0]["share"]] == [0.5, 0.5]
    full = api.post("/api/v1/bookings/", {"gpu_fraction": 0.25, **window}, format="json")
    assert full.status_code == 409, full.json()
    assert "room on a shared GPU" in error_of(full)["message"]
    # The estimate says when the next window of that length has room: at their end.
    estimate = api.post(
        "/api/v1/bookings/estimate/", {"gpu_fraction": 0.25, **window}, format="json"
    ).json()
    found = timezone.datetime.fromisoformat(estimate["next_window"]["start"])
    assert found == timezone.datetime.fromisoformat(window["end"])
    # The queue plans around the reservations: a half that would overlap them waits.
    queued = _get(api, _submit(api, gpu_fraction=0.75, duration_s=4 * 3600))
    assert queued["state"] == "pending"


@pytest.fixture
def staff_api(db):
    admin = UserFactory(username="ops", is_staff=True, is_superuser=True)
    client = APIClient()
    client.force_authenticate(admin)
    return client


def test_it_lets_staff_share_a_gpu_and_not_members(api, staff_api, cluster):
    gpu = cluster[0].gpus.get(index=3)
    refused = api.patch(f"/api/v1/gpus/{gpu.pk}/", {"sharing": "shared"}, format="json")
    assert refused.status_code == 403
    response = staff_api.patch(f"/api/v1/gpus/{gpu.pk}/", {"sharing": "shared"}, format="json")
    assert response.status_code == 200, response.json()
    assert response.json()["sharing"] == "shared"
    gpu.refresh_from_db()
    assert gpu.sharing == Gpu.Sharing.SHARED
    bad = staff_api.patch(f"/api/v1/gpus/{gpu.pk}/", {"sharing": "half"}, format="json")
    assert bad.status_code == 400 and "sharing" in error_of(bad)["fields"]


def test_it_refuses_to_share_a_gpu_under_a_whole_booking(staff_api, cluster):
    gpu = cluster[0].gpus.get(index=0)
    booking = make_active_booking([gpu])
    response = staff_api.patch(f"/api/v1/gpus/{gpu.pk}/", {"sharing": "shared"}, format="json")
    assert response.status_code == 409
    assert str(booking.pk) in error_of(response)["message"]
    gpu.refresh_from_db()
    assert gpu.sharing == Gpu.Sharing.EXCLUSIVE


def test_it_refuses_to_make_a_gpu_exclusive_under_fractions(api, staff_api, site):
    whole, shared = site
    booking = _submit(api, gpu_fraction=0.25, duration_s=3600)
    response = staff_api.patch(
        f"/api/v1/gpus/{shared.pk}/", {"sharing": "exclusive"}, format="json"
    )
    assert response.status_code == 409
    assert str(booking) in error_of(response)["message"]


def test_it_shares_a_nodes_gpus_all_or_none(staff_api, cluster):
    node = cluster[1]
    ok = staff_api.post(f"/api/v1/nodes/{node.pk}/sharing/", {"sharing": "shared"}, format="json")
    assert ok.status_code == 200, ok.json()
    assert ok.json()["changed"] == 8
    assert set(node.gpus.values_list("sharing", flat=True)) == {"shared"}
    busy = cluster[0]
    make_active_booking([busy.gpus.get(index=5)])
    refused = staff_api.post(
        f"/api/v1/nodes/{busy.pk}/sharing/", {"sharing": "shared"}, format="json"
    )
    assert refused.status_code == 409
    assert set(busy.gpus.values_list("sharing", flat=True)) == {"exclusive"}


def test_it_rechecks_the_room_on_a_shared_gpu_at_start(site):
    whole, shared = site
    now = timezone.now()
    owner = UserFactory()
    for share in (0.5, 0.25):
        AllocationFactory(
            booking=BookingFactory(owner=owner, gpu_fraction=share, state=Booking.State.ACTIVE),
            gpu=shared,
            start=now,
            end=now + timedelta(hours=1),
            fraction=share,
            share=share,
            gpu_memory_mib=int(share * 81920),
        )
    end = now + timedelta(minutes=30)
    assert share_fits(gpu_id=shared.pk, share=0.25, memory_mib=20480, start=now, end=end)
    assert not share_fits(gpu_id=shared.pk, share=0.5, memory_mib=1024, start=now, end=end)
    assert not share_fits(gpu_id=shared.pk, share=0.1, memory_mib=30000, start=now, end=end)
    # After they end there is room again; on an exclusive GPU never.
    later = (now + timedelta(hours=1), now + timedelta(hours=2))
    assert share_fits(gpu_id=shared.pk, share=1.0, memory_mib=81920, start=later[0], end=later[1])
    assert not share_fits(gpu_id=whole.pk, share=0.1, memory_mib=1, start=now, end=end)


def test_it_lets_fractions_share_a_gpu_but_not_a_whole_booking_in_the_database(site):
    # The exclusion constraint (PostgreSQL) keeps whole devices apart from fractions.
    from django.db import IntegrityError, connection, transaction

    if connection.vendor != "postgresql":
        pytest.skip("SQLite has no exclusion constraints")
    whole, shared = site
    now = timezone.now()
    for share in (0.5, 0.25):
        AllocationFactory(gpu=shared, start=now, fraction=share, share=share, gpu_memory_mib=1)
    with pytest.raises(IntegrityError), transaction.atomic():
        AllocationFactory(gpu=shared, start=now)
    assert Allocation.objects.filter(gpu=shared).count() == 2


def test_it_extends_a_fraction_while_its_gpu_has_room(api, bob, site):
    whole, shared = site
    mine = _submit(api, gpu_fraction=0.5, duration_s=3600)
    _submit(bob, gpu_fraction=0.5, duration_s=7200)  # beside it, an hour longer
    ok = api.post(f"/api/v1/bookings/{mine}/extend/", {"by_s": 1800}, format="json")
    assert ok.status_code == 200, ok.json()
    allocation = Allocation.objects.get(booking_id=mine, live=True)
    assert allocation.end - allocation.start == timedelta(seconds=5400)
    # Another half is held from its new end on: no room to extend into.
    AllocationFactory(
        gpu=shared, start=allocation.end, fraction=0.5, share=0.5, gpu_memory_mib=40960
    )
    refused = api.post(f"/api/v1/bookings/{mine}/extend/", {"by_s": 600}, format="json")
    assert refused.status_code == 409
    assert "no room" in error_of(refused)["fields"]["by_s"]


@pytest.mark.django_db(transaction=True)
def test_it_gives_the_room_on_a_shared_gpu_to_one_of_two_concurrent_reservations():
    from tests.factories import ProjectFactory, QuotaFactory
    from tests.races import post_at_once

    node = make_node("only", gpus=1)
    Gpu.objects.filter(node=node).update(sharing=Gpu.Sharing.SHARED)
    users = [UserFactory(username=f"racer{i}") for i in range(2)]
    for i, u in enumerate(users):  # two projects: no quota lock in common
        project = ProjectFactory(slug=f"race{i}")
        QuotaFactory(project=project)
        member(u, project)
    body = {"gpu_fraction": 0.75, **_window(1)}
    statuses = post_at_once(users, "/api/v1/bookings/", body)
    assert sorted(statuses) == [201, 409]
    assert list(Allocation.objects.filter(live=True).values_list("share", flat=True)) == [0.75]


@pytest.mark.parametrize(
    ("fraction", "memory", "said"),
    [
        (0.25, None, "0.25 of a shared GPU"),
        (None, 20480, "20480 MiB of a shared GPU"),
        (0.25, 20480, "0.25 of a shared GPU, 20480 MiB"),
    ],
)
def test_it_describes_a_fraction_as_asked(fraction, memory, said):
    assert Booking(gpus=1, gpu_fraction=fraction, gpu_memory_mib=memory).describe_request() == said
