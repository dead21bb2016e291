"""Who is on my GPU: per-process rollups from the agents' readings, on the GPU, booking and
overview pages."""

from datetime import UTC, datetime, timedelta

import pytest
from django.test import Client

from agents.protocol import DeviceReading, ProcessReading, ReadingsRequest
from portal.models import NodeAlert, ProcessUsage
from portal.services.fleet.telemetry import samples_ingest
from tests.factories import make_active_booking, make_node

pytestmark = pytest.mark.django_db


def _ingest(node, when, readings, commits):
    with commits(execute=True):
        samples_ingest(
            node=node,
            request=ReadingsRequest(hostname=node.hostname, time=when, readings=readings),
        )


def _reading(uuid, *processes):
    return DeviceReading(uuid, 50.0, 10.0, 1000, 81920, 50.0, 200.0, list(processes))


@pytest.fixture
def scene(user, project, django_capture_on_commit_callbacks):
    """node-w: gpu0 booked by alice running train.py, gpu1 unbooked with eve's miner on it."""
    node = make_node("node-w", gpus=2)
    gpu0, gpu1 = node.gpus.order_by("index")
    booking = make_active_booking([gpu0], owner=user, project=project)
    t0 = datetime.now(UTC) - timedelta(seconds=20)
    for step, memory in enumerate((4000, 9000, 6000)):
        _ingest(
            node,
            t0 + timedelta(seconds=5 * step),
            [
                _reading(gpu0.uuid, ProcessReading(4242, "alice", memory, "train.py")),
                _reading(gpu1.uuid, ProcessReading(666, "eve", 512, "miner")),
            ],
            django_capture_on_commit_callbacks,
        )
    return node, gpu0, gpu1, booking, t0


def test_it_keeps_one_row_per_process_with_its_peak_memory_and_time_seen(scene):
    node, gpu0, gpu1, booking, t0 = scene
    mine = ProcessUsage.objects.get(device_uuid=gpu0.uuid)
    assert (mine.booking_id, mine.pid, mine.user, mine.name) == (
        booking.pk,
        4242,
        "alice",
        "train.py",
    )
    assert (mine.samples, mine.peak_memory_mib, mine.foreign) == (3, 9000, False)
    assert mine.first_seen == t0 and mine.last_seen == t0 + timedelta(seconds=10)
    theirs = ProcessUsage.objects.get(device_uuid=gpu1.uuid)
    assert theirs.booking_id is None and theirs.foreign and theirs.samples == 3
    assert ProcessUsage.objects.count() == 2  # a rollup, not a row per sample


def test_it_names_the_processes_on_the_gpu_page_and_marks_the_ones_nobody_booked(scene, user):
    node, gpu0, gpu1, booking, t0 = scene
    client = Client()
    client.force_login(user)
    page = client.get(f"/gpus/{gpu1.pk}/").content.decode()
    assert "Who is on this GPU" in page
    assert "miner" in page and "eve" in page and 'class="process-unbooked"' in page
    page0 = client.get(f"/gpus/{gpu0.pk}/").content.decode()
    assert "train.py" in page0 and "9000 MiB" in page0  # the peak in the last 24 hours
    assert 'class="process-unbooked"' not in page0


def test_it_marks_a_process_the_agent_reported_as_foreign(scene, user):
    node, gpu0, gpu1, booking, t0 = scene
    NodeAlert.objects.create(
        node=node,
        kind=NodeAlert.Kind.FOREIGN_PROCESS,
        time=t0,
        device_uuid=gpu0.uuid,
        pid=4242,
        user="alice",
        booking=booking,
    )
    client = Client()
    client.force_login(user)
    page = client.get(f"/bookings/{booking.pk}/").content.decode()
    assert "Processes on its devices" in page and "train.py" in page
    assert 'class="process-foreign"' in page


def test_it_shows_a_device_with_unbooked_processes_as_in_use_not_free(scene, user):
    from portal.services.inventory import telemetry_cache

    node, gpu0, gpu1, booking, t0 = scene
    assert telemetry_cache.latest_by_uuid([gpu1.uuid])[gpu1.uuid]["processes"]
    client = Client()
    client.force_login(user)
    page = client.get("/?state=unbooked").content.decode()
    assert 'state-unbooked">in use, unbooked</span>' in page and "node-w/gpu1" in page
    everything = client.get("/").content.decode()
    assert everything.count('state-unbooked">in use, unbooked</span>') == 1  # gpu0 is booked


def test_it_says_in_use_unbooked_not_free_on_the_gpu_page_and_the_calendar(scene, user):
    node, gpu0, gpu1, booking, t0 = scene
    client = Client()
    client.force_login(user)
    page = client.get(f"/gpus/{gpu1.pk}/").content.decode()
    assert 'id="device-state" data-state-of="' in page
    assert 'data-state="unbooked">in use, unbooked</span>' in page
    assert "not free" in page
    # The state is a fragment, so the live page can re-fetch it when the processes change.
    fragment = client.get(f"/gpus/{gpu1.pk}/?fragment=state").content.decode()
    assert "in use, unbooked" in fragment
    booked = client.get(f"/gpus/{gpu0.pk}/?fragment=state").content.decode()
    assert 'data-state="in_use">in use</span>' in booked and f"#{booking.pk}" in booked
    calendar = client.get("/calendar/").content.decode()
    assert calendar.count('class="badge state-unbooked"') == 1
    assert 'unbooked<span class="visually-hidden"> use now, not free</span>' in calendar
    assert f'data-state-of="{gpu1.uuid}" data-state="unbooked"' in calendar


def test_it_says_free_on_the_gpu_page_of_an_idle_unbooked_gpu(user):
    node = make_node("node-idle", gpus=1)
    client = Client()
    client.force_login(user)
    page = client.get(f"/gpus/{node.gpus.get().pk}/").content.decode()
    assert 'data-state="free">free</span>' in page and "not free" not in page


# -- a shared GPU: its tenants, each with its share and the memory its processes use ---------


@pytest.fixture
def shared_scene(user, project, django_capture_on_commit_callbacks):
    """node-s: gpu0 shared by alice (60 %, 40 GiB) and bob (40 %, 20 GiB), each with a process
    the agent attributed to its booking, and one it could attribute to neither."""
    from tests.factories import UserFactory, make_shared_booking

    node = make_node("node-s", gpus=1)
    gpu = node.gpus.get()
    mine = make_shared_booking(gpu, share=0.6, memory_mib=40960, owner=user, project=project)
    bob = UserFactory(username="bob")
    theirs = make_shared_booking(gpu, share=0.4, memory_mib=20480, owner=bob)
    t0 = datetime.now(UTC) - timedelta(seconds=10)
    for step in range(2):
        _ingest(
            node,
            t0 + timedelta(seconds=5 * step),
            [
                _reading(
                    gpu.uuid,
                    ProcessReading(101, "alice", 12288, "train.py", mine.pk),
                    ProcessReading(202, "bob", 24576, "serve.py", theirs.pk),
                    ProcessReading(303, "bob", 512, "python", None),
                )
            ],
            django_capture_on_commit_callbacks,
        )
    return node, gpu, mine, theirs


def test_it_rolls_up_each_tenants_processes_under_its_own_booking(shared_scene):
    node, gpu, mine, theirs = shared_scene
    rows = {p.pid: p for p in ProcessUsage.objects.filter(device_uuid=gpu.uuid)}
    assert (rows[101].booking_id, rows[202].booking_id) == (mine.pk, theirs.pk)
    assert (rows[101].samples, rows[202].peak_memory_mib) == (2, 24576)
    # Two tenants and the agent named neither: no booking, but not unbooked either.
    assert (rows[303].booking_id, rows[303].foreign) == (None, False)


def test_it_shows_a_shared_gpus_tenants_with_their_shares_and_memory(shared_scene, user):
    node, gpu, mine, theirs = shared_scene
    client = Client()
    client.force_login(user)
    page = client.get(f"/gpus/{gpu.pk}/").content.decode()
    assert "Tenants of this shared GPU" in page
    tenants = page[page.index('id="tenants-h"') : page.index('id="proc-h"')]
    assert tenants.index(f'data-tenant="{mine.pk}"') < tenants.index(f'data-tenant="{theirs.pk}"')
    mine_row = tenants[tenants.index(f'data-tenant="{mine.pk}"') :]
    assert "60 %" in mine_row and "40.0 GiB" in mine_row and "12.0 GiB" in mine_row
    theirs_row = tenants[tenants.index(f'data-tenant="{theirs.pk}"') :]
    assert "40 %" in theirs_row and "20.0 GiB" in theirs_row and "24.0 GiB" in theirs_row
    assert 'class="process-foreign"' in theirs_row and "over its memory share" in theirs_row
    assert f"shared by #{mine.pk} alice, #{theirs.pk} bob" in page  # its state line
    assert (
        f'href="/bookings/{mine.pk}/"' in tenants
        and f'href="/bookings/{theirs.pk}/"' not in tenants
    )
    # Who is on it now, per tenant.
    now = page[page.index('id="proc-h"') :]
    assert f'alice <span class="muted">#{mine.pk}</span>' in now
    assert f'bob <span class="muted">#{theirs.pk}</span>' in now


def test_the_overview_lists_every_tenant_of_a_shared_gpu(shared_scene, user):
    node, gpu, mine, theirs = shared_scene
    client = Client()
    client.force_login(user)
    for path in ("/", f"/?fragment=node&node={node.hostname}"):
        page = client.get(path).content.decode()
        row = page[page.index(f'data-uuid="{gpu.uuid}"') :]
        row = row[: row.index("</tr>")]
        assert f'data-tenant="{mine.pk}"' in row and f'data-tenant="{theirs.pk}"' in row, path
        assert "60 % · 12.0 GiB of 40.0 GiB" in row and "bob" in row
        assert "over its memory share" in row  # bob's 24 GiB of a 20 GiB share
