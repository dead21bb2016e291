"""Inventory changes on a node with history: replaced, swapped, removed and added cards, MIG
re-layouts. Devices with history are retired, never deleted; a retired device is never offered.

Registers go through the real agent endpoint with the node's own token.
"""

from datetime import timedelta

import pytest
from django.utils import timezone

from agents import protocol
from portal.models import Allocation, Booking, Gpu, MigInstance
from portal.services.allocation.allocation import allocation_pass
from portal.services.allocation.snapshot import snapshot_take
from portal.services.inventory import placement
from portal.services.inventory import selectors as inventory
from tests.factories import (
    AllocationFactory,
    BookingFactory,
    UserFactory,
    make_active_booking,
    member,
)
from tests.portal_agent.conftest import AgentClient

# Hardware changes under history in the default mode too: these run on SQLite as well.
pytestmark = [pytest.mark.django_db, pytest.mark.both_databases]


def _gpu(index: int, uuid: str, migs=()) -> dict:
    return {
        "index": index,
        "uuid": uuid,
        "model": "NVIDIA A100-80GB",
        "memory_total_mib": 81920,
        "mig_mode": bool(migs),
        "mig_instances": [
            {
                "uuid": m_uuid,
                "profile": profile,
                "slices": int(profile.split("g.")[0]),
                "memory_total_mib": int(profile.split("g.")[0]) * 10240,
            }
            for m_uuid, profile in migs
        ],
    }


def _register(agent: AgentClient, *gpus: dict, hostname: str = "node-a"):
    body = {
        "hostname": hostname,
        "agent_version": "0.1.0",
        "protocol": protocol.PROTOCOL_VERSION,
        "gpus": list(gpus),
    }
    return agent.post(protocol.REGISTER_PATH, body)


@pytest.fixture
def agent():
    from portal.services.fleet.nodes import node_token_issue
    from tests.factories import NodeFactory

    NodeFactory(hostname="node-a")
    return AgentClient(node_token_issue(hostname="node-a"))


def _history(device) -> Booking:
    """A finished booking that held `device` (Gpu or MigInstance) an hour ago."""
    start = timezone.now() - timedelta(hours=2)
    booking = BookingFactory(state=Booking.State.FINISHED, started_at=start, ended_at=start)
    is_mig = isinstance(device, MigInstance)
    AllocationFactory(
        booking=booking,
        gpu=device.gpu if is_mig else device,
        mig_instance=device if is_mig else None,
        start=start,
        end=start + timedelta(hours=1),
        live=False,
        fraction=device.fraction if is_mig else 1.0,
    )
    return booking


def _live_gpus() -> list[tuple[int, str]]:
    rows = Gpu.objects.filter(retired_at__isnull=True).order_by("index")
    return list(rows.values_list("index", "uuid"))


def _offered_uuids() -> set[str]:
    """Every device uuid any offering path shows: snapshot, admission, ?free=true, selectors."""
    snap = snapshot_take(now=timezone.now())
    ids = {d.id for d in snap.state.devices}
    gpu_pks = {int(i.split(":")[1]) for i in ids if i.startswith("gpu:")}
    mig_pks = {int(i.split(":")[1]) for i in ids if i.startswith("mig:")}
    uuids = set(Gpu.objects.filter(pk__in=gpu_pks).values_list("uuid", flat=True))
    uuids |= set(MigInstance.objects.filter(pk__in=mig_pks).values_list("uuid", flat=True))
    uuids |= set(inventory.gpus_bookable().values_list("uuid", flat=True))
    uuids |= set(inventory.mig_instances_bookable().values_list("uuid", flat=True))
    now = timezone.now()
    uuids |= set(inventory.gpus_free_now(Gpu.objects.all(), now=now).values_list("uuid", flat=True))
    uuids |= set(
        inventory.mig_instances_free_now(MigInstance.objects.all(), now=now).values_list(
            "uuid", flat=True
        )
    )
    return uuids


def test_it_retires_a_replaced_card_with_history_and_answers_2xx(agent):
    assert _register(agent, _gpu(0, "GPU-old"), _gpu(1, "GPU-one")).status_code == 200
    old = Gpu.objects.get(uuid="GPU-old")
    booking = _history(old)

    response = _register(agent, _gpu(0, "GPU-new"), _gpu(1, "GPU-one"))

    assert response.status_code == 200
    assert _live_gpus() == [(0, "GPU-new"), (1, "GPU-one")]
    old.refresh_from_db()
    assert old.retired_at is not None
    assert Allocation.objects.get(booking=booking).gpu_id == old.pk  # history intact
    assert "GPU-old" not in _offered_uuids()
    assert {"GPU-new", "GPU-one"} <= _offered_uuids()
    assert len(inventory.admission_devices()) == 2


def test_it_swaps_two_cards_with_history_and_keeps_their_ids(agent):
    _register(agent, _gpu(0, "GPU-a"), _gpu(1, "GPU-b"))
    a, b = Gpu.objects.get(uuid="GPU-a"), Gpu.objects.get(uuid="GPU-b")
    _history(a), _history(b)

    response = _register(agent, _gpu(0, "GPU-b"), _gpu(1, "GPU-a"))

    assert response.status_code == 200
    assert _live_gpus() == [(0, "GPU-b"), (1, "GPU-a")]
    assert Gpu.objects.get(uuid="GPU-a").pk == a.pk and Gpu.objects.get(uuid="GPU-b").pk == b.pk


def test_it_retires_a_removed_card_with_history_and_deletes_one_without(agent):
    _register(agent, _gpu(0, "GPU-a"), _gpu(1, "GPU-b"), _gpu(2, "GPU-c"))
    _history(Gpu.objects.get(uuid="GPU-b"))

    assert _register(agent, _gpu(0, "GPU-a")).status_code == 200

    assert _live_gpus() == [(0, "GPU-a")]
    assert Gpu.objects.get(uuid="GPU-b").retired_at is not None
    assert not Gpu.objects.filter(uuid="GPU-c").exists()
    assert _offered_uuids() == {"GPU-a"}


def test_it_adds_a_card(agent):
    _register(agent, _gpu(0, "GPU-a"))
    assert _register(agent, _gpu(0, "GPU-a"), _gpu(1, "GPU-b")).status_code == 200
    assert _live_gpus() == [(0, "GPU-a"), (1, "GPU-b")]
    assert _offered_uuids() == {"GPU-a", "GPU-b"}


def test_it_revives_a_retired_card_reported_again(agent):
    _register(agent, _gpu(0, "GPU-a"), _gpu(1, "GPU-b"))
    b = Gpu.objects.get(uuid="GPU-b")
    _history(b)
    _register(agent, _gpu(0, "GPU-a"))
    assert Gpu.objects.get(pk=b.pk).retired_at is not None

    assert _register(agent, _gpu(0, "GPU-a"), _gpu(3, "GPU-b")).status_code == 200

    b.refresh_from_db()
    assert b.retired_at is None and b.index == 3
    assert _offered_uuids() == {"GPU-a", "GPU-b"}


def test_it_retires_old_mig_instances_after_a_re_layout(agent, project, user):
    _register(agent, _gpu(0, "GPU-m", [("MIG-1", "3g.40gb"), ("MIG-2", "2g.20gb")]))
    _history(MigInstance.objects.get(uuid="MIG-1"))

    response = _register(agent, _gpu(0, "GPU-m", [("MIG-3", "4g.40gb"), ("MIG-4", "3g.40gb")]))

    assert response.status_code == 200
    assert MigInstance.objects.get(uuid="MIG-1").retired_at is not None
    assert not MigInstance.objects.filter(uuid="MIG-2").exists()
    assert _offered_uuids() == {"MIG-3", "MIG-4"}
    assert inventory.mig_profiles() == ["3g.40gb", "4g.40gb"]
    booking = BookingFactory(owner=user, project=project, mig_profile="3g.40gb", gpus=0)
    allocation_pass(now=timezone.now())
    booking.refresh_from_db()
    assert booking.state == Booking.State.ACTIVE
    assert Allocation.objects.get(booking=booking).mig_instance.uuid == "MIG-4"


def test_it_retires_mig_instances_when_a_gpu_leaves_mig_mode(agent):
    _register(agent, _gpu(0, "GPU-m", [("MIG-1", "3g.40gb")]))
    _history(MigInstance.objects.get(uuid="MIG-1"))

    assert _register(agent, _gpu(0, "GPU-m")).status_code == 200

    assert MigInstance.objects.get(uuid="MIG-1").retired_at is not None
    assert _offered_uuids() == {"GPU-m"}


def test_it_stops_a_live_booking_on_a_removed_card_with_the_reason(agent, settings):
    settings.REQUEUE_ON_NODE_FAILURE = True
    _register(agent, _gpu(0, "GPU-a"), _gpu(1, "GPU-b"), _gpu(2, "GPU-c"))
    batch = make_active_booking([Gpu.objects.get(uuid="GPU-b")], command="python train.py")
    interactive = make_active_booking([Gpu.objects.get(uuid="GPU-c")])

    assert _register(agent, _gpu(0, "GPU-a"), _gpu(2, "GPU-new")).status_code == 200

    batch.refresh_from_db(), interactive.refresh_from_db()
    assert batch.state == Booking.State.PENDING
    assert "GPU 1 of node-a was removed" in batch.state_detail
    assert interactive.state == Booking.State.FAILED
    assert "GPU 2 of node-a was replaced (new UUID GPU-new)" in interactive.state_detail
    assert not Allocation.objects.filter(live=True, gpu__uuid__in=["GPU-b", "GPU-c"]).exists()
    assert agent.get(protocol.DESIRED_PATH).json()["bookings"] == []  # the agent ends them


def test_it_fails_a_live_booking_on_an_instance_of_an_old_mig_layout(agent):
    _register(agent, _gpu(0, "GPU-m", [("MIG-1", "3g.40gb"), ("MIG-2", "3g.40gb")]))
    kept = make_active_booking([MigInstance.objects.get(uuid="MIG-2")])
    gone = make_active_booking([MigInstance.objects.get(uuid="MIG-1")])

    layout = [("MIG-2", "3g.40gb"), ("MIG-3", "2g.20gb")]
    assert _register(agent, _gpu(0, "GPU-m", layout)).status_code == 200

    gone.refresh_from_db(), kept.refresh_from_db()
    assert gone.state == Booking.State.FAILED
    assert gone.state_detail == (
        "MIG instance 3g.40gb (MIG-1) of GPU 0 of node-a was removed (a new MIG layout)"
    )
    assert kept.state == Booking.State.ACTIVE
    desired = agent.get(protocol.DESIRED_PATH).json()["bookings"]
    assert [(b["booking_id"], b["device_uuids"]) for b in desired] == [(kept.pk, ["MIG-2"])]


def test_it_keeps_the_reason_within_state_detail_for_a_long_hostname():
    from portal.services.fleet.nodes import node_token_issue
    from tests.factories import NodeFactory

    hostname = ".".join(["n" * 62] * 4)  # 251 characters, a host name of four labels
    NodeFactory(hostname=hostname)
    agent = AgentClient(node_token_issue(hostname=hostname))
    _register(agent, _gpu(0, "GPU-m", [("MIG-1", "3g.40gb")]), hostname=hostname)
    booking = make_active_booking([MigInstance.objects.get(uuid="MIG-1")], command="train")

    layout = [("MIG-2", "3g.40gb")]
    assert _register(agent, _gpu(0, "GPU-m", layout), hostname=hostname).status_code == 200

    booking.refresh_from_db()
    assert booking.state == Booking.State.PENDING
    assert booking.state_detail.startswith("MIG instance 3g.40gb (MIG-1) of GPU 0 of nnn")
    assert booking.state_detail.endswith("…; requeued")


def test_it_shows_a_retired_card_and_its_bookings_where_history_is(agent, admin_client):
    _register(agent, _gpu(0, "GPU-old"))
    old = Gpu.objects.get(uuid="GPU-old")
    booking = _history(old)
    _register(agent, _gpu(0, "GPU-new"))

    page = admin_client.get(f"/gpus/{old.pk}/")
    assert page.status_code == 200
    assert "retired" in page.content.decode() and "Book a" not in page.content.decode()
    detail = admin_client.get(f"/bookings/{booking.pk}/")
    assert detail.status_code == 200 and "node-a/gpu0" in detail.content.decode()


def _planned(device: Gpu, **kwargs) -> Booking:
    start = timezone.now() + timedelta(hours=1)
    booking = BookingFactory(
        state=Booking.State.PLANNED, start=start, end=start + timedelta(hours=1), **kwargs
    )
    AllocationFactory(booking=booking, gpu=device, start=start, end=booking.end)
    return booking


def test_it_moves_a_planned_reservation_off_a_removed_card(agent):
    _register(agent, _gpu(0, "GPU-a"), _gpu(1, "GPU-b"))
    booking = _planned(Gpu.objects.get(uuid="GPU-b"))

    assert _register(agent, _gpu(0, "GPU-a")).status_code == 200

    booking.refresh_from_db()
    assert booking.state == Booking.State.PLANNED
    live = Allocation.objects.get(booking=booking, live=True)
    assert live.gpu.uuid == "GPU-a" and live.start == booking.start
    assert "GPU 1 of node-a was removed" in booking.state_detail


def test_it_fails_a_planned_reservation_when_no_device_is_free(agent):
    _register(agent, _gpu(0, "GPU-a"), _gpu(1, "GPU-b"))
    booking = _planned(Gpu.objects.get(uuid="GPU-b"))
    _planned(Gpu.objects.get(uuid="GPU-a"))

    assert _register(agent, _gpu(0, "GPU-a")).status_code == 200

    booking.refresh_from_db()
    assert booking.state == Booking.State.FAILED
    assert "GPU 1 of node-a was removed" in booking.state_detail
    assert not Allocation.objects.filter(booking=booking, live=True).exists()


def test_it_never_places_a_reservation_on_a_retired_card(agent):
    _register(agent, _gpu(0, "GPU-a"), _gpu(1, "GPU-b"))
    _history(Gpu.objects.get(uuid="GPU-b"))
    _register(agent, _gpu(0, "GPU-a"))
    start = timezone.now() + timedelta(hours=1)

    slots, free, _ = placement.devices_for_window(
        start=start, end=start + timedelta(hours=1), gpus=2
    )

    assert slots is None and free == 1


def test_it_lists_only_live_devices_as_free_and_on_the_overview(agent, api, admin_client):
    _register(agent, _gpu(0, "GPU-a"), _gpu(1, "GPU-b", [("MIG-1", "3g.40gb")]))
    _history(MigInstance.objects.get(uuid="MIG-1"))
    _history(Gpu.objects.get(uuid="GPU-a"))
    _register(agent, _gpu(1, "GPU-b"))

    gpus = api.get("/api/v1/gpus/?free=true").json()["results"]
    migs = api.get("/api/v1/mig-instances/?free=true").json()["results"]
    assert [g["uuid"] for g in gpus] == ["GPU-b"]
    assert migs == []
    retired = api.get("/api/v1/gpus/?retired=true").json()["results"]
    assert [(g["uuid"], g["retired_at"] is not None) for g in retired] == [("GPU-a", True)]
    assert api.get("/api/v1/gpus/?free=false").json()["count"] == 1
    page = admin_client.get("/").content.decode()
    assert "node-a/gpu1" in page
    assert "node-a/gpu0" not in page and "node-a/gpu1/3g.40gb" not in page


def test_it_refuses_two_gpus_at_one_index_with_the_field(agent):
    from tests.conftest import error_of

    response = _register(agent, _gpu(0, "GPU-a"), _gpu(0, "GPU-b"))

    assert response.status_code == 400
    assert error_of(response)["fields"] == {"gpus[1].index": "the same index as another GPU"}
    assert not Gpu.objects.exists()


def test_it_moves_a_card_retired_on_another_node_but_refuses_a_live_one(agent):
    from portal.services.fleet.nodes import node_token_issue
    from tests.factories import NodeFactory

    NodeFactory(hostname="node-b")
    other = AgentClient(node_token_issue(hostname="node-b"))
    body = {"hostname": "node-b", "agent_version": "0.1.0", "protocol": 1}
    other.post(protocol.REGISTER_PATH, {**body, "gpus": [_gpu(0, "GPU-x"), _gpu(1, "GPU-y")]})
    _history(Gpu.objects.get(uuid="GPU-x"))
    other.post(protocol.REGISTER_PATH, {**body, "gpus": [_gpu(1, "GPU-y")]})

    assert _register(agent, _gpu(0, "GPU-x")).status_code == 200
    assert Gpu.objects.get(uuid="GPU-x").node.hostname == "node-a"
    assert _register(agent, _gpu(0, "GPU-x"), _gpu(1, "GPU-y")).status_code == 403


def test_it_never_starts_a_booking_on_a_retired_device(agent, project, user):
    from portal.services.allocation.pass_start import start_planned

    _register(agent, _gpu(0, "GPU-m", [("MIG-1", "3g.40gb")]))
    booking = BookingFactory(owner=user, project=project, mig_profile="3g.40gb", gpus=0)
    now = timezone.now()
    snap = snapshot_take(now=now)
    rows = list(snap.devices.values())
    _history(MigInstance.objects.get(uuid="MIG-1"))
    _register(agent, _gpu(0, "GPU-m", [("MIG-2", "3g.40gb")]))

    assert not start_planned(
        pending=snap.pending[booking.pk], rows=rows, snap=snap, now=now, done=set()
    )
    booking.refresh_from_db()
    assert booking.state == Booking.State.PENDING


@pytest.mark.django_db(transaction=True)
def test_it_never_starts_a_booking_on_a_card_a_register_is_retiring(settings):
    import threading

    from django.db import connection, transaction

    from portal.services.allocation.pass_start import start_planned
    from portal.services.fleet.nodes import node_inventory_update
    from tests.factories import ProjectFactory, QuotaFactory, make_node

    if connection.vendor != "postgresql":
        pytest.skip("a race of row locks: PostgreSQL only (SQLite serialises every writer)")
    settings.BOOKING_LOCK_TIMEOUT_MS = 300
    node = make_node("node-a", gpus=2)
    a, b = node.gpus.order_by("index")
    _history(b)
    user, project = UserFactory(), ProjectFactory()
    member(user, project)
    QuotaFactory(project=project, max_gpus=None)
    booking = BookingFactory(owner=user, project=project, gpus=1)
    now = timezone.now()
    snap = snapshot_take(now=now)
    started = []

    def pass_start():  # the pass applies a start planned on card b while the register runs
        try:
            rows = [snap.devices[f"gpu:{b.pk}"]]
            started.append(
                start_planned(
                    pending=snap.pending[booking.pk], rows=rows, snap=snap, now=now, done=set()
                )
            )
        finally:
            connection.close()

    with transaction.atomic():
        info = {"index": 0, "uuid": a.uuid, "model": a.model, "memory_total_mib": a.memory_mib}
        node_inventory_update(node=node, gpus=[info])
        other = threading.Thread(target=pass_start)
        other.start()
        other.join(timeout=10)

    other.join(timeout=10)
    booking.refresh_from_db()
    assert started == [False]
    assert booking.state == Booking.State.PENDING
    assert not Allocation.objects.filter(booking=booking).exists()
