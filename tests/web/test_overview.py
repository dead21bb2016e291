"""The overview's first screen: a cached summary versioned by the outbox, nodes expanded on
demand, live patches after a booking fact."""

import asyncio
from datetime import timedelta

import pytest
from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.utils import timezone

from portal.models import Allocation, Booking
from portal.services.booking.bookings import booking_release
from portal.services.core.outbox import fact_record
from portal.services.realtime.live import QUEUE_GROUP
from portal.web import overview, overview_page
from portal.web.selectors import device_rows
from tests.factories import make_active_booking, make_mig_gpu, make_node

pytestmark = pytest.mark.django_db


@pytest.fixture
def client_in(client, user, project):
    client.force_login(user)
    return client


def _free_now(client) -> str:
    return client.get("/?fragment=totals").content.decode().split('data-total="free_gpus">')[1][:3]


def test_it_counts_what_is_free_by_node_and_by_model(cluster, user, project):
    make_mig_gpu(cluster[1], 8)
    make_node("node-c", gpus=2, model="H100-80GB")
    make_active_booking([cluster[0].gpus.get(index=0)], owner=user, project=project)
    rows = device_rows(now=timezone.now())
    lines = {line.hostname: line for line in overview.node_lines(rows, {"empty": "down"})}
    assert (lines["node-a"].gpus, lines["node-a"].free_gpus) == (8, 7)
    assert (lines["node-b"].slices, lines["node-b"].free_slices) == (4, 4)
    assert lines["empty"].gpus == 0 and lines["empty"].state == "down"
    models = {m.model: m for m in overview.model_lines(list(lines.values()))}
    assert (models["A100-80GB"].gpus, models["A100-80GB"].free_gpus) == (16, 15)
    assert (models["H100-80GB"].gpus, models["H100-80GB"].free_gpus) == (2, 2)


def test_it_serves_the_cached_summary_until_a_fact_commits(client_in, user, project, cluster):
    assert _free_now(client_in).startswith("16")
    # A change that records no fact is not seen while the summary is young...
    booking = make_active_booking([cluster[0].gpus.get(index=0)], owner=user, project=project)
    assert _free_now(client_in).startswith("16")
    # ...nor a fact just recorded (its subscriber folds it in)...
    now = timezone.now()
    later = now + timedelta(seconds=overview.SUMMARY_MIN_AGE_S)
    fact_record(kind="booking_changed", booking_id=booking.pk, payload={"event": "started"})
    assert overview.overview_summary(now=later)[1] is None
    # ...but one that no subscriber folded in within the grace makes the next open count again.
    grace = later + timedelta(seconds=overview.FACT_GRACE_S + overview.SUMMARY_MIN_AGE_S)
    summary, rows = overview.overview_summary(now=grace)
    assert rows is not None and summary.totals.free_gpus == 15


def test_it_folds_a_booking_fact_into_the_summary_without_a_rebuild(
    user, project, cluster, django_capture_on_commit_callbacks
):
    booking = make_active_booking([cluster[0].gpus.get(index=0)], owner=user, project=project)
    now = timezone.now()
    before, _ = overview.overview_summary(now=now)
    assert before.totals.free_gpus == 15
    with django_capture_on_commit_callbacks(execute=True):
        booking_release(user=user, booking_id=booking.pk, now=now)
    later = now + timedelta(seconds=overview.SUMMARY_MIN_AGE_S)
    summary, rows = overview.overview_summary(now=later)
    assert rows is None  # folded in by the subscriber, not rebuilt
    assert summary.totals.free_gpus == 16 and summary.version > before.version
    assert {m.model: m.free_gpus for m in summary.models} == {"A100-80GB": 16}


def test_it_lists_nodes_and_loads_their_devices_only_when_expanded(client_in):
    for n in range(9):  # 72 GPUs: more than a site whose nodes open with their devices
        make_node(f"n{n:02d}")
    body = client_in.get("/").content.decode()
    assert body.count('data-node-line="') == 9
    assert "data-uuid=" not in body
    assert '<strong data-total="free_gpus">72</strong>' in body
    node = client_in.get("/?fragment=node&node=n03").content.decode()
    assert node.count("data-uuid=") == 8
    assert "n03/gpu7" in node and "n04/gpu0" not in node
    assert '"A100-80GB": [8, 8, 0, 0]' in node.replace("&quot;", '"')


def test_it_opens_the_node_filtered_for_with_its_devices(client_in):
    for n in range(9):
        make_node(f"n{n:02d}")
    body = client_in.get("/?node=n05").content.decode()
    assert body.count("data-uuid=") == 8
    assert body.count(" hidden>") >= 8  # the other nodes' lines, kept for the totals


def test_it_refuses_an_unknown_node(client_in, cluster):
    assert client_in.get("/?fragment=node&node=nope").status_code == 404


def _listen_queue():
    layer = get_channel_layer()
    channel = async_to_sync(layer.new_channel)()
    async_to_sync(layer.group_add)(QUEUE_GROUP, channel)

    def receive(kind: str, timeout=5.0):
        async def get():
            while True:
                message = await asyncio.wait_for(layer.receive(channel), timeout=timeout)
                if message["type"] == kind:
                    return message

        return async_to_sync(get)()

    return receive


def test_it_patches_open_pages_after_a_booking_fact(
    user, project, cluster, django_capture_on_commit_callbacks
):
    gpu = cluster[1].gpus.get(index=2)
    booking = make_active_booking([gpu], owner=user, project=project)
    receive = _listen_queue()
    with django_capture_on_commit_callbacks(execute=True):
        booking_release(user=user, booking_id=booking.pk, now=timezone.now())
    assert Booking.objects.get(pk=booking.pk).state == Booking.State.FINISHED
    patch = receive(overview.PATCH_TYPE)
    assert patch["owner_id"] == user.pk
    assert [n["hostname"] for n in patch["nodes"]] == ["node-b"]
    assert patch["nodes"][0]["counts"] == {"A100-80GB": [8, 8, 0, 0]}
    device = next(d for d in patch["devices"] if d["uuid"] == gpu.uuid)
    assert device["state"] == "free" and device["booking"] is None
    assert len(patch["devices"]) == 8  # the node's devices only, not the site's


def test_it_patches_a_booking_that_took_devices_with_its_holder(user, project, cluster):
    booking = make_active_booking([cluster[0].gpus.get(index=1)], owner=user, project=project)
    hosts = sorted(
        Allocation.objects.filter(booking=booking).values_list("gpu__node__hostname", flat=True)
    )
    patch = overview.patch_build(hostnames=hosts, owner_id=user.pk)
    held = [d for d in patch["devices"] if d["booking"]]
    assert [d["booking"]["id"] for d in held] == [booking.pk]
    assert held[0]["booking"]["owner"] == user.username
    assert patch["nodes"][0]["counts"]["A100-80GB"][1] == 7


def test_it_lists_a_dozen_of_my_live_bookings_and_links_the_rest(client_in, user, project):
    from tests.factories import BookingFactory

    for _ in range(overview_page.MINE_SHOWN + 1):
        BookingFactory(owner=user, project=project)
    body = client_in.get("/?fragment=mine").content.decode()
    assert body.count('class="mine-item"') == overview_page.MINE_SHOWN
    assert 'More on <a href="/bookings/">My bookings</a>' in body


def test_it_rebuilds_off_the_request_while_serving_the_old_summary(transactional_db):
    import threading

    from tests.factories import ProjectFactory, UserFactory

    node = make_node("node-a")
    owner, project = UserFactory(), ProjectFactory()
    now = timezone.now()
    first, _ = overview.overview_summary(now=now)
    make_active_booking([node.gpus.get(index=0)], owner=owner, project=project)
    later = now + timedelta(seconds=overview.SUMMARY_MAX_AGE_S)
    overview.summary_forget(shared=False)
    served, rows = overview.overview_summary(now=later)
    assert served == first and rows is None  # the old one, at once
    for thread in threading.enumerate():
        if thread.name == "overview-summary":
            thread.join(10)
    overview.summary_forget(shared=False)
    assert overview.overview_summary(now=later)[0].totals.free_gpus == 7
