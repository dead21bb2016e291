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
