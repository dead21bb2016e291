"""MIG layouts that change: staff ask (API), the pass plans the change for when the GPU's slices
are all free and plans no booking across it, the agent is told, its register retires the old
slices (kept with their history) and adds the new ones, and the change is done."""

from datetime import timedelta

import pytest
from django.contrib.auth.models import Permission
from django.utils import timezone
from rest_framework.test import APIClient

from agents import protocol
from portal.models import Allocation, AuditEvent, Booking, Gpu, MigInstance, MigLayoutChange
from portal.services.allocation.allocation import allocation_pass
from portal.services.fleet.nodes import node_token_issue
from tests.conftest import error_of
from tests.factories import BookingFactory, NodeFactory, UserFactory, make_active_booking
from tests.portal_agent.conftest import AgentClient

pytestmark = pytest.mark.django_db

NEW = [{"profile": "4g.40gb"}, {"profile": "2g.20gb"}, {"profile": "1g.10gb", "start": 6}]


def _mig(uuid, profile, start):
    slices = int(profile[0])
    return {
        "uuid": uuid,
        "profile": profile,
        "slices": slices,
        "memory_total_mib": slices * 10240,
        "placement_start": start,
    }


def _register(agent, migs, results=(), whole=False):
    gpus = [
        {
            "index": 0,
            "uuid": "GPU-mig",
            "model": "NVIDIA A100-80GB",
            "memory_total_mib": 81920,
            "mig_mode": not whole,
            "mig_instances": [] if whole else migs,
        }
    ]
    body = {
        "hostname": "node-m",
        "agent_version": "0.1.0",
        "protocol": protocol.PROTOCOL_VERSION,
        "gpus": gpus,
        "mig_changes": list(results),
    }
    response = agent.post(protocol.REGISTER_PATH, body)
    assert response.status_code == 200, response.content
    return response


@pytest.fixture
def agent():
    NodeFactory(hostname="node-m", state="up")
    client = AgentClient(node_token_issue(hostname="node-m"))
    _register(client, [_mig("MIG-a", "3g.40gb", 0), _mig("MIG-b", "3g.40gb", 4)])
    return client


@pytest.fixture
def gpu(agent):
    return Gpu.objects.get(uuid="GPU-mig")


@pytest.fixture
def staff():
    """Staff with the right to change GPUs (the roles table's "perm")."""
    bob = UserFactory(username="bob", is_staff=True)
    bob.user_permissions.add(Permission.objects.get(codename="change_gpu"))
    client = APIClient()
    client.force_authenticate(bob)
    return client


def _put(client, gpu, instances):
    return client.put(f"/api/v1/gpus/{gpu.pk}/mig-layout/", {"instances": instances}, format="json")


# -- the API -------------------------------------------------------------------------------


def test_it_accepts_a_layout_from_staff_and_places_it(staff, gpu):
    response = _put(staff, gpu, NEW)
    assert response.status_code == 202, response.content
    body = response.json()
    assert body["state"] == "requested"
    assert body["layout"] == [
        {"profile": "4g.40gb", "start": 0},
        {"profile": "2g.20gb", "start": 4},
        {"profile": "1g.10gb", "start": 6},
    ]
    assert body["previous"] == [
        {"profile": "3g.40gb", "start": 0},
        {"profile": "3g.40gb", "start": 4},
    ]
    shown = staff.get(f"/api/v1/gpus/{gpu.pk}/mig-layout/").json()
    assert shown["change"]["id"] == body["id"]
    (event,) = AuditEvent.objects.filter(action="gpu.mig_layout")
    assert (event.actor_name, event.via, event.target_id) == ("bob", "api", str(gpu.pk))
    assert shown["allowed"]["model"] == "A100-80GB"
    assert {
        "profile": "3g.40gb",
        "slices": 3,
        "memory_slices": 4,
        "starts": [0, 4],
        "max_count": 2,
    } in shown["allowed"]["profiles"]


def test_it_refuses_a_member_and_staff_without_the_right_with_403(api, gpu):
    assert _put(api, gpu, NEW).status_code == 403
    plain = APIClient()
    plain.force_authenticate(UserFactory(username="carl", is_staff=True))
    response = _put(plain, gpu, NEW)
    assert response.status_code == 403 and error_of(response)["code"] == "forbidden"
    assert plain.get("/api/v1/mig-layout-changes/").status_code == 403
    assert not MigLayoutChange.objects.exists()


@pytest.mark.parametrize(
    ("instances", "field", "reason"),
    [
        ([{"profile": "5g.50gb"}], "instances[0].profile", "not a MIG profile of A100-80GB"),
        ([{"profile": "3g.40gb", "start": 2}], "instances[0].start", "starts at 0, 4"),
        (
            [{"profile": "4g.40gb", "start": 0}, {"profile": "3g.40gb", "start": 0}],
            "instances[1].start",
            "overlaps instances[0]",
        ),
        ([{"profile": "7g.80gb"}, {"profile": "1g.10gb"}], "instances", "no placement"),
        ([{"profile": "3g.40gb", "start": "4"}], "instances[0].start", "a whole number"),
        ([{"profile": "3g.40gb", "slices": 3}], "instances[0]", "profile and start"),
        ("3g.40gb", "instances", "a list"),
        ([{"profile": "1g.10gb"}] * 9, "instances", "at most 7"),
        ([{"profile": "3g.40gb"}, {"profile": "3g.40gb"}], "instances", "has this layout already"),
    ],
)
def test_it_refuses_a_layout_the_model_does_not_allow_with_400_naming_the_field(
    staff, gpu, instances, field, reason
):
    response = _put(staff, gpu, instances)
    assert response.status_code == 400, response.content
    error = error_of(response)
    assert reason in error["fields"][field]
    assert not MigLayoutChange.objects.exists()


def test_it_refuses_a_layout_for_a_gpu_not_in_mig_mode_with_400(staff, agent):
    _register(agent, [], whole=True)
    gpu = Gpu.objects.get(uuid="GPU-mig")
    response = _put(staff, gpu, NEW)
    assert response.status_code == 400
    assert "is not in MIG mode" in error_of(response)["fields"]["gpu"]


def test_it_answers_404_for_an_unknown_gpu_and_409_for_a_second_change(staff, gpu):
    assert (
        staff.put("/api/v1/gpus/999999/mig-layout/", {"instances": NEW}, format="json").status_code
        == 404
    )
    assert _put(staff, gpu, NEW).status_code == 202
    again = _put(staff, gpu, [{"profile": "7g.80gb"}])
    assert again.status_code == 409 and "under way" in error_of(again)["message"]


def test_it_cancels_a_change_once_and_approves_only_a_proposal(staff, gpu):
    change = _put(staff, gpu, NEW).json()
    assert staff.post(f"/api/v1/mig-layout-changes/{change['id']}/approve/").status_code == 409
    cancelled = staff.post(f"/api/v1/mig-layout-changes/{change['id']}/cancel/")
    assert cancelled.status_code == 200 and cancelled.json()["state"] == "cancelled"
    again = staff.post(f"/api/v1/mig-layout-changes/{change['id']}/cancel/")
    assert again.status_code == 409 and error_of(again)["code"] == "invalid_state"
    listed = staff.get("/api/v1/mig-layout-changes/").json()["results"]
    assert [row["state"] for row in listed] == ["cancelled"]
    assert _put(staff, gpu, NEW).status_code == 202  # the GPU is free for a new change


# -- the agent's register ------------------------------------------------------------------


def _applying(gpu, layout):
    return MigLayoutChange.objects.create(
        gpu=gpu, layout=layout, state=MigLayoutChange.State.APPLYING, applying_since=timezone.now()
    )


PLACED = [
    {"profile": "4g.40gb", "start": 0},
    {"profile": "2g.20gb", "start": 4},
    {"profile": "1g.10gb", "start": 6},
]
NEW_MIGS = [_mig("MIG-c", "4g.40gb", 0), _mig("MIG-d", "2g.20gb", 4), _mig("MIG-e", "1g.10gb", 6)]


def test_it_fails_a_change_the_agent_reports_as_failed_with_its_reason(agent, gpu):
    change = _applying(gpu, PLACED)
    result = {
        "change_id": change.pk,
        "ok": False,
        "detail": "nvmlGpuInstanceDestroy failed: In use",
    }
    _register(agent, [_mig("MIG-a", "3g.40gb", 0), _mig("MIG-b", "3g.40gb", 4)], [result])
    change.refresh_from_db()
    assert change.state == "failed"
    assert change.detail == "nvmlGpuInstanceDestroy failed: In use"


def test_it_fails_a_change_whose_register_shows_another_layout(agent, gpu):
    change = _applying(gpu, PLACED)
    _register(agent, [_mig("MIG-c", "7g.80gb", 0)], [{"change_id": change.pk, "ok": True}])
    change.refresh_from_db()
    assert change.state == "failed"
    assert change.detail == "the agent reported 7g.80gb@0, not the layout asked for"


def test_it_ignores_a_result_for_another_nodes_change(agent, gpu):
    other = Gpu.objects.create(
        node=NodeFactory(hostname="node-x"),
        index=0,
        uuid="GPU-x",
        model="A100-80GB",
        memory_mib=81920,
        mig_mode=True,
    )
    change = _applying(other, PLACED)
    _register(agent, NEW_MIGS, [{"change_id": change.pk, "ok": True}])
    change.refresh_from_db()
    assert change.state == "applying"


# -- the whole change, on both databases ---------------------------------------------------


def _desired(agent):
    response = agent.get(protocol.DESIRED_PATH)
    assert response.status_code == 200
    return protocol.from_json(protocol.DesiredState, response.content)


@pytest.mark.both_databases
def test_it_plans_applies_and_records_a_mig_layout_change(agent, gpu, staff, user, project):
    now = timezone.now()
    old_a, old_b = MigInstance.objects.get(uuid="MIG-a"), MigInstance.objects.get(uuid="MIG-b")
    running = make_active_booking([old_a], owner=user, project=project)
    change_id = _put(staff, gpu, NEW).json()["id"]

    # Planned at the end of the booking on MIG-a; MIG-b is free now but nothing crosses it.
    allocation_pass(now=now)
    change = MigLayoutChange.objects.get(pk=change_id)
    ends = Allocation.objects.get(booking=running).end
    assert change.state == "planned"
    assert abs(change.planned_at - ends) < timedelta(milliseconds=10)  # SQLite's julianday
    waiting = BookingFactory(
        owner=user, project=project, mig_profile="3g.40gb", gpus=0, duration_s=7200
    )
    allocation_pass(now=now)
    waiting.refresh_from_db()
    assert waiting.state == Booking.State.PENDING
    assert waiting.pending_reason == "mig_change"
    assert "node-m/gpu0 changes its MIG layout at" in waiting.state_detail
    assert _desired(agent).mig_layouts == []

    # The booking ends: the change applies, and the node's agent is told what to create.
    Allocation.objects.filter(booking=running).update(end=now + timedelta(seconds=1))
    later = now + timedelta(seconds=2)
    allocation_pass(now=later)
    assert MigLayoutChange.objects.get(pk=change_id).state == "applying"
    (layout,) = _desired(agent).mig_layouts
    assert layout.gpu_uuid == "GPU-mig"
    assert [(s.profile, s.start, s.size, s.gi_profile) for s in layout.instances] == [
        ("4g.40gb", 0, 4, "4_SLICE"),
        ("2g.20gb", 4, 2, "2_SLICE"),
        ("1g.10gb", 6, 1, "1_SLICE"),
    ]

    # Its register: the old slices retired (MIG-a with its history), the new ones live.
    _register(agent, NEW_MIGS, [{"change_id": change_id, "ok": True}])
    change = MigLayoutChange.objects.get(pk=change_id)
    assert change.state == "done" and change.finished_at is not None
    live = MigInstance.objects.filter(gpu=gpu, retired_at__isnull=True).order_by("placement_start")
    assert [(m.uuid, m.profile, m.placement_start) for m in live] == [
        ("MIG-c", "4g.40gb", 0),
        ("MIG-d", "2g.20gb", 4),
        ("MIG-e", "1g.10gb", 6),
    ]
    old_a.refresh_from_db()
    assert old_a.retired_at is not None
    assert Allocation.objects.filter(mig_instance=old_a).exists()
    assert not MigInstance.objects.filter(pk=old_b.pk).exists()  # never booked: deleted
    assert _desired(agent).mig_layouts == []
    shown = staff.get(f"/api/v1/mig-layout-changes/{change_id}/").json()
    assert shown["state"] == "done"


# -- MIG_AUTO_LAYOUT -----------------------------------------------------------------------


def _waiting_2g(user, project, waited_s):
    booking = BookingFactory(owner=user, project=project, mig_profile="2g.20gb", gpus=0)
    submitted = timezone.now() - timedelta(seconds=waited_s)
    Booking.objects.filter(pk=booking.pk).update(submitted_at=submitted)
    return booking


def test_it_proposes_nothing_when_the_setting_is_off(agent, gpu, user, project):
    _waiting_2g(user, project, 7200)
    allocation_pass(now=timezone.now())
    assert not MigLayoutChange.objects.exists()


@pytest.mark.both_databases
def test_it_proposes_a_layout_staff_approve_then_applies_it(
    agent, gpu, user, project, staff, settings
):
    settings.MIG_AUTO_LAYOUT = "propose"
    _waiting_2g(user, project, 600)
    allocation_pass(now=timezone.now())
    assert not MigLayoutChange.objects.exists()  # not waited MIG_AUTO_LAYOUT_WAIT_S yet
    _waiting_2g(user, project, 7200)
    allocation_pass(now=timezone.now())
    (change,) = MigLayoutChange.objects.all()
    assert change.state == "proposed" and change.requested_by is None
    assert [i["profile"] for i in change.layout] == ["2g.20gb", "2g.20gb", "2g.20gb", "1g.10gb"]
    assert "which no idle GPU offers" in change.detail
    allocation_pass(now=timezone.now())
    assert MigLayoutChange.objects.count() == 1  # one proposal per profile, held until approved
    assert staff.post(f"/api/v1/mig-layout-changes/{change.pk}/approve/").status_code == 200
    allocation_pass(now=timezone.now())
    change.refresh_from_db()
    assert change.state == "applying"  # its GPU is idle: at once
    assert [s.profile for s in _desired(agent).mig_layouts[0].instances][0] == "2g.20gb"


def test_it_applies_its_own_proposal_when_the_setting_says_apply(
    agent, gpu, user, project, settings
):
    settings.MIG_AUTO_LAYOUT = "apply"
    _waiting_2g(user, project, 7200)
    allocation_pass(now=timezone.now())
    change = MigLayoutChange.objects.get()
    assert change.state == "requested"  # the next pass plans around it, then applies it
    allocation_pass(now=timezone.now())
    change.refresh_from_db()
    assert change.state == "applying"
    assert "approved by MIG_AUTO_LAYOUT=apply" in change.detail


# -- /admin/ -------------------------------------------------------------------------------


def test_it_takes_a_layout_in_the_admin_and_shows_how_it_goes(admin_client, gpu):
    response = admin_client.post(
        "/admin/portal/miglayoutchange/add/",
        {"gpu": gpu.pk, "instances": "4g.40gb+2g.20gb+1g.10gb@6"},
    )
    assert response.status_code == 302, response.content.decode()[:2000]
    change = MigLayoutChange.objects.get()
    assert change.state == "requested" and change.layout == PLACED
    listed = admin_client.get("/admin/portal/miglayoutchange/").content.decode()
    assert "4g.40gb@0 + 2g.20gb@4 + 1g.10gb@6" in listed and "Requested" in listed
    shown = admin_client.get(f"/admin/portal/miglayoutchange/{change.pk}/change/")
    assert shown.status_code == 200 and "3g.40gb" in shown.content.decode()  # the previous


def test_it_refuses_a_layout_nvidia_does_not_allow_in_the_admin(admin_client, gpu):
    response = admin_client.post(
        "/admin/portal/miglayoutchange/add/", {"gpu": gpu.pk, "instances": "3g.40gb@2"}
    )
    assert response.status_code == 200
    assert "starts at 0, 4 on A100-80GB, not 2" in response.content.decode()
    assert not MigLayoutChange.objects.exists()


def test_it_approves_and_cancels_with_the_admin_actions(admin_client, gpu):
    proposal = MigLayoutChange.objects.create(
        gpu=gpu, layout=PLACED, state=MigLayoutChange.State.PROPOSED, detail="waited"
    )
    url = "/admin/portal/miglayoutchange/"
    admin_client.post(url, {"action": "approve", "_selected_action": [proposal.pk]})
    proposal.refresh_from_db()
    assert proposal.state == "requested"
    admin_client.post(url, {"action": "cancel", "_selected_action": [proposal.pk]})
    proposal.refresh_from_db()
    assert proposal.state == "cancelled"


# -- advance reservations ------------------------------------------------------------------


def _reserve(api, start, end):
    body = {"mig_profile": "3g.40gb", "start": start.isoformat(), "end": end.isoformat()}
    return api.post("/api/v1/bookings/", body, format="json")


@pytest.mark.both_databases
def test_it_reserves_no_slice_of_a_changing_gpu_past_its_change(api, staff, gpu, user, project):
    make_active_booking([MigInstance.objects.get(uuid="MIG-a")], owner=user, project=project)
    change_id = _put(staff, gpu, NEW).json()["id"]
    now = timezone.now()
    allocation_pass(now=now)
    planned_at = MigLayoutChange.objects.get(pk=change_id).planned_at
    across = _reserve(api, now + timedelta(minutes=10), planned_at + timedelta(minutes=30))
    assert across.status_code == 409, across.content
    before = _reserve(api, now + timedelta(minutes=10), planned_at - timedelta(minutes=5))
    assert before.status_code == 201, before.content
    assert before.json()["devices"][0]["uuid"] == "MIG-b"
