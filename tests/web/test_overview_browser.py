"""The overview in headless Chromium on a seeded site: nodes load their devices when expanded,
and a booking change arrives as a patch, not as a re-fetch of the page's fragments."""

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django.utils import timezone

from portal.models import Booking, Gpu, Node, Project
from portal.services.booking.bookings import booking_release
from portal.services.reporting.demo import DEMO_PASSWORD
from tests.factories import make_active_booking, make_node
from tests.web.conftest import ARTIFACTS, in_thread, sign_in, wait_for

pytestmark = pytest.mark.browser


@pytest.fixture
def seeded(transactional_db):
    """The demo site and eight more nodes of 8 GPUs: too many devices to open every node."""
    call_command("seed_demo", verbosity=0)
    Node.objects.update(state=Node.State.UP)  # as if their agents had reported
    for n in range(8):
        make_node(f"gpu-b{n:02d}", model="L40S")
    alice = User.objects.get(username="alice")
    gpu = Gpu.objects.get(node__hostname="gpu-a02", index=0)
    booking = make_active_booking([gpu], owner=alice, project=Project.objects.get(slug="vision"))
    return alice, gpu, booking


def _free(page, selector: str) -> str:
    return page.text_content(f"{selector} [data-count='free_gpus']").strip()


def test_it_expands_a_node_and_patches_it_live(seeded, asgi_server, browser_page):
    alice, gpu, booking = seeded
    page = browser_page
    sign_in(page, asgi_server, "alice", DEMO_PASSWORD)
    page.wait_for_selector("body[data-live-state='open']")
    assert page.locator("[data-node-line]").count() == 11
    assert page.locator("tr[data-uuid]").count() == 0  # devices load per node, on demand
    node = "[data-node-line='gpu-a02']"
    assert _free(page, node) == "7"
    total = int(page.text_content("[data-total='free_gpus']"))
    page.evaluate(
        "window.__fragments = [];"
        "document.addEventListener('portal:fragment', e => window.__fragments.push(e.detail));"
        "window.__sameDocument = true"
    )

    page.click(f"{node} summary")
    badge = f"tr[data-uuid='{gpu.uuid}'] .badge"
    page.wait_for_selector(badge)
    assert page.locator(f"{node} tr[data-uuid]").count() == 8
    assert page.text_content(badge).strip() == "booked"
    assert f"#{booking.pk}" in page.text_content(f"tr[data-uuid='{gpu.uuid}'] [data-booking-cell]")

    in_thread(booking_release, user=alice, booking_id=booking.pk, now=timezone.now())
    wait_for(page, f"document.querySelector(\"{badge}\").textContent.trim() === 'free'")
    assert Booking.objects.get(pk=booking.pk).state == Booking.State.FINISHED
    wait_for(
        page, f"document.querySelector(\"{node} [data-count='free_gpus']\").textContent === '8'"
    )
    assert int(page.text_content("[data-total='free_gpus']")) == total + 1
    wait_for(
        page,
        "document.querySelector(\"[data-model-line='A100-80GB'] [data-count='free_gpus']\").textContent === '12'",
    )
    assert page.text_content(f"tr[data-uuid='{gpu.uuid}'] [data-booking-cell]").strip() == "—"
    # Only the owner's own list was fetched again (the booking is alice's); nodes, totals and
    # models were patched in place.
    wait_for(page, "window.__fragments.includes('mine')")
    assert set(page.evaluate("window.__fragments")) == {"mine"}
    assert page.evaluate("window.__sameDocument") is True

    # After a drop everything is fetched again (what holds the focus waits for it to leave);
    # the node that was open stays open.
    page.evaluate("document.activeElement.blur(); window.portalLive.drop()")
    wait_for(page, "window.__fragments.includes('devices')", timeout_s=20)
    wait_for(page, f'document.querySelectorAll("{node} tr[data-uuid]").length === 8')
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "overview-live-patch.png"), full_page=True)
