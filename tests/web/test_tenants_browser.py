"""A shared GPU's tenants in headless Chromium: the overview lists them, the live patch keeps
the list when one leaves, and the GPU page shows each tenant's share and memory."""

from datetime import UTC, datetime

import pytest
from django.utils import timezone

from agents.protocol import DeviceReading, ProcessReading, ReadingsRequest
from portal.services.booking.bookings import booking_release
from portal.services.fleet.telemetry import samples_ingest
from tests.factories import ProjectFactory, UserFactory, make_node, make_shared_booking, member
from tests.web.conftest import ARTIFACTS, in_thread, sign_in, wait_for

pytestmark = pytest.mark.browser


@pytest.fixture
def shared(transactional_db):
    """node-t: gpu0 shared by alice (0.5, 40 GiB) and bob (0.25, 20 GiB, over it now)."""
    node = make_node("node-t", gpus=2, model="H100-80GB")
    gpu = node.gpus.get(index=0)
    project = ProjectFactory(slug="vision")
    alice, bob = UserFactory(username="alice"), UserFactory(username="bob")
    member(alice, project)
    member(bob, project)
    mine = make_shared_booking(gpu, share=0.5, memory_mib=40960, owner=alice, project=project)
    theirs = make_shared_booking(gpu, share=0.25, memory_mib=20480, owner=bob, project=project)
    processes = [
        ProcessReading(101, "alice", 12288, "train.py", mine.pk),
        ProcessReading(202, "bob", 23552, "serve.py", theirs.pk),
    ]
    reading = DeviceReading(gpu.uuid, 71.0, 30.0, 35840, 81920, 55.0, 410.0, processes)
    samples_ingest(
        node=node,
        request=ReadingsRequest(hostname="node-t", time=datetime.now(UTC), readings=[reading]),
    )
    return gpu, alice, mine, theirs


def test_it_lists_a_shared_gpus_tenants_and_keeps_the_list_live(shared, asgi_server, browser_page):
    gpu, alice, mine, theirs = shared
    page = browser_page
    sign_in(page, asgi_server, "alice", "pw-secret-123")
    page.wait_for_selector("body[data-live-state='open']")
    cell = f"tr[data-uuid='{gpu.uuid}'] [data-booking-cell]"
    page.wait_for_selector(f"{cell} [data-tenant='{theirs.pk}']")
    text = page.text_content(cell)
    assert f"#{mine.pk} alice 50 % · 12.0 GiB of 40.0 GiB" in " ".join(text.split())
    assert "over its memory share" in text  # bob: 23 GiB of 20
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "shared-gpu-overview.png"), full_page=True)

    in_thread(booking_release, user=alice, booking_id=mine.pk, now=timezone.now())
    wait_for(
        page,
        f'document.querySelectorAll("{cell} [data-tenant]").length === 1'
        f" && !!document.querySelector(\"{cell} [data-tenant='{theirs.pk}']\")",
    )
    left = " ".join(page.text_content(cell).split())
    assert left == f"#{theirs.pk} bob 25 % · 23.0 GiB of 20.0 GiB over its memory share"

    page.goto(f"{asgi_server}/gpus/{gpu.pk}/")
    tenants = page.locator("table.tenants")
    assert tenants.locator("tbody tr").count() == 1  # alice's ended
    row = " ".join(tenants.locator(f"tr[data-tenant='{theirs.pk}']").text_content().split())
    assert row == f"#{theirs.pk} bob (vision) 25 % 20.0 GiB 23.0 GiB over its memory share"
    page.screenshot(path=str(ARTIFACTS / "shared-gpu-page.png"), full_page=True)
