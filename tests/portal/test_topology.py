"""GPU topology end to end: an agent's register stores it, the allocation pass and advance
reservations place by it, and the GPU, booking and API pages show it."""

from datetime import timedelta

import pytest
from django.utils import timezone

from agents import protocol
from portal.models import Booking, Gpu, Node
from portal.services.allocation.snapshot import snapshot_take
from portal.services.fleet.nodes import node_inventory_from_spec, node_token_issue
from portal.services.inventory import placement
from tests.conftest import error_of
from tests.factories import NodeFactory, make_active_booking
from tests.portal_agent.conftest import AgentClient

pytestmark = pytest.mark.django_db


def _gpu(index: int, uuid: str, **topology) -> dict:
    return {
        "index": index,
        "uuid": uuid,
        "model": "NVIDIA A100-80GB",
        "memory_total_mib": 81920,
        "mig_mode": False,
        "mig_instances": [],
        **topology,
    }


def _register(agent: AgentClient, *gpus: dict):
    body = {"hostname": "node-t", "agent_version": "0.1.0", "protocol": 1, "gpus": list(gpus)}
    return agent.post(protocol.REGISTER_PATH, body)


@pytest.fixture
def agent():
    NodeFactory(hostname="node-t")
    return AgentClient(node_token_issue(hostname="node-t"))


def test_it_stores_the_topology_a_register_reports_and_shows_it(agent, admin_client):
    response = _register(
        agent,
        _gpu(0, "GPU-0", pci_bus_id="0000:18:00.0", numa_node=0, nvlink_peers=[1]),
        _gpu(1, "GPU-1", pci_bus_id="0000:19:00.0", numa_node=1, nvlink_peers=[0, 0]),
        _gpu(2, "GPU-2"),  # an agent that cannot read it sends none
    )
    assert response.status_code == 200, response.json()
    stored = {
        g.index: (g.pci_bus_id, g.numa_node, g.nvlink_peers) for g in Gpu.objects.order_by("index")
    }
    assert stored == {0: ("0000:18:00.0", 0, [1]), 1: ("0000:19:00.0", 1, [0]), 2: ("", None, [])}

    gpu0, gpu1, gpu2 = Gpu.objects.order_by("index")
    page = admin_client.get(f"/gpus/{gpu0.pk}/").content.decode()
    assert f'NVLink to <a href="/gpus/{gpu1.pk}/">gpu1</a> · NUMA node 0' in page
    assert "<code>0000:18:00.0</code>" in page
    assert "not reported by its agent" in admin_client.get(f"/gpus/{gpu2.pk}/").content.decode()

    api = admin_client.get(f"/api/v1/gpus/{gpu0.pk}/").json()
    assert (api["pci_bus_id"], api["numa_node"], api["nvlink_peers"]) == ("0000:18:00.0", 0, [1])
    listed = admin_client.get("/api/v1/gpus/").json()["results"]
    assert [row["nvlink_peers"] for row in listed] == [[1], [0], []]


@pytest.mark.parametrize(
    ("peers", "field", "reason"),
    [
        ([5], "gpus[0].nvlink_peers[0]", "no GPU of this node has index 5"),
        ([1, 0], "gpus[0].nvlink_peers[1]", "a GPU is not its own NVLink peer"),
        ([-1], "gpus[0].nvlink_peers[0]", "must be between 0 and 63"),
    ],
)
def test_it_refuses_bad_peers_naming_the_field_and_writes_nothing(agent, peers, field, reason):
    response = _register(agent, _gpu(0, "GPU-0", nvlink_peers=peers), _gpu(1, "GPU-1"))
    assert response.status_code == 400
    assert error_of(response)["fields"] == {field: reason}
    assert not Gpu.objects.exists()


def test_a_replaced_card_gets_its_own_topology(agent):
    _register(agent, _gpu(0, "GPU-old", numa_node=0, nvlink_peers=[1]), _gpu(1, "GPU-1"))
    make_active_booking([Gpu.objects.get(uuid="GPU-old")])  # history: the old card is retired
    response = _register(agent, _gpu(0, "GPU-new", numa_node=1), _gpu(1, "GPU-1"))
    assert response.status_code == 200
    new = Gpu.objects.get(uuid="GPU-new")
    assert (new.numa_node, new.nvlink_peers) == (1, [])
    assert Gpu.objects.get(uuid="GPU-old").retired_at is not None


@pytest.fixture
def cube_mesh(db):
    """An up node of the simulated 8-GPU cube-mesh (NVLink quads 0-3 and 4-7), in rack r1."""
    NodeFactory(hostname="dgx-1", network_group="r1")
    node_inventory_from_spec(hostname="dgx-1", spec="8xV100-32GB@cube-mesh")
    Node.objects.filter(hostname="dgx-1").update(state=Node.State.UP)
    return {g.index: g for g in Gpu.objects.filter(node__hostname="dgx-1")}


def test_the_scheduler_sees_the_topology_and_the_network_group(cube_mesh):
    devices = {d.id: d for d in snapshot_take(now=timezone.now()).state.devices}
    first = devices[f"gpu:{cube_mesh[0].pk}"]
    assert set(first.links) == {f"gpu:{cube_mesh[i].pk}" for i in (1, 2, 3, 4)}
    assert (first.numa, first.group) == (0, "r1")


def test_a_booking_gets_the_free_nvlink_quad_and_its_page_says_so(
    cube_mesh, api, project, submit, client, user
):
    make_active_booking([cube_mesh[0]])  # quad 0-3 is not whole any more
    booking = Booking.objects.get(pk=submit(gpus=4, duration_s=600))
    assert booking.state == Booking.State.ACTIVE
    held = sorted(booking.allocations.values_list("gpu__index", flat=True))
    assert held == [4, 5, 6, 7]  # not the lowest free ids 1-4
    client.force_login(user)
    page = client.get(f"/bookings/{booking.pk}/").content.decode()
    assert "4 GPUs, fully NVLink-connected, NUMA 1" in page
    node = client.get("/?node=dgx-1").content.decode()
    assert "· NUMA 1 · NVLink to 0, 5, 6, 7" in node  # gpu4's row among the node's devices


def test_a_reservation_gets_the_free_nvlink_quad_too(cube_mesh):
    start = timezone.now() + timedelta(hours=1)
    make_active_booking([cube_mesh[5]])
    slots, _, _ = placement.devices_for_window(
        start=timezone.now(), end=start + timedelta(hours=1), gpus=4
    )
    assert sorted(slot.gpu for slot in slots) == sorted(cube_mesh[i].pk for i in (0, 1, 2, 3))


def test_a_multi_node_reservation_takes_nodes_of_one_rack(db):
    for hostname, group in (("n1", "r1"), ("n2", "r2"), ("n3", "r1")):
        NodeFactory(hostname=hostname, network_group=group)
        node_inventory_from_spec(hostname=hostname, spec="8xV100-32GB@cube-mesh")
    Node.objects.update(state=Node.State.UP)
    start = timezone.now() + timedelta(hours=1)
    slots, _, _ = placement.devices_for_window(start=start, end=start + timedelta(hours=1), gpus=16)
    hosts = set(
        Gpu.objects.filter(pk__in=[s.gpu for s in slots]).values_list("node__hostname", flat=True)
    )
    assert hosts == {"n1", "n3"}


def test_the_nodes_api_and_the_gpu_page_show_the_network_group(cube_mesh, admin_client):
    nodes = admin_client.get("/api/v1/nodes/").json()["results"]
    assert [(n["hostname"], n["network_group"]) for n in nodes] == [("dgx-1", "r1")]
    page = admin_client.get(f"/gpus/{cube_mesh[0].pk}/").content.decode()
    assert "network group r1" in page


def test_a_site_may_let_a_booking_wait_a_bounded_time_for_a_better_set(
    cube_mesh, api, project, submit, settings
):
    policy = {**settings.SCHEDULER_POLICY, "topology_wait_s": 3600.0, "protect_oldest": 0}
    settings.SCHEDULER_POLICY = policy
    make_active_booking([cube_mesh[0]])  # for an hour
    soon = make_active_booking([cube_mesh[5]])
    soon.allocations.update(end=timezone.now() + timedelta(minutes=10))
    booking = Booking.objects.get(pk=submit(gpus=4, duration_s=600))
    assert (booking.state, booking.pending_reason) == (Booking.State.PENDING, "topology")
    assert "3600 s" in booking.state_detail
    assert booking.planned_start <= timezone.now() + timedelta(minutes=10, seconds=5)
