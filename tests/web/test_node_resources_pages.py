"""Cores and host memory on the pages: each node's line on the overview (patched live), its
expanded devices, and on a booking's page what it holds on each node."""

import pytest
from django.utils import timezone

from portal.models import Node
from portal.services.booking.bookings import booking_release
from tests.factories import ProjectFactory, UserFactory, make_active_booking, make_node, member
from tests.web.conftest import ARTIFACTS, in_thread, sign_in, wait_for

GIB = 1024


def _site(user, project):
    """gpu-c01: 4 GPUs, 96 cores, 1024 GiB. The user's booking asked 40 cores and 320 GiB with
    one GPU; another holds two GPUs and their share (48 cores, 512 GiB). gpu-c02 reports none."""
    node = make_node("gpu-c01", gpus=4, model="H100-80GB")
    Node.objects.filter(pk=node.pk).update(cpus=96, memory_mib=1024 * GIB)
    gpus = list(node.gpus.order_by("index"))
    mine = make_active_booking(
        [gpus[0]], owner=user, project=project, cpus=40, memory_mib=320 * GIB
    )
    other = make_active_booking(gpus[1:3], project=project)
    make_node("gpu-c02", gpus=1)
    return mine, other


@pytest.mark.django_db
def test_it_shows_cores_and_memory_in_use_per_node_and_per_booking(client, user, project):
    mine, _ = _site(user, project)
    client.force_login(user)
    overview = client.get("/").content.decode()
    line = overview.split('data-node-line="gpu-c01"')[1].split("</summary>")[0]
    assert 'CPU <span data-resource="0">88</span> / <span data-resource="1">96</span> cores' in line
    assert (
        '<span data-resource="2" data-gib>832</span> / <span data-resource="3" data-gib>1024'
        in line
    )
    other_line = overview.split('data-node-line="gpu-c02"')[1].split("</summary>")[0]
    assert "data-resources hidden" in other_line
    node = client.get("/", {"fragment": "node", "node": "gpu-c01"}).content.decode()
    assert 'max="96" value="88"' in node and "data-gib>832</span> / 1024 GiB" in node
    page = client.get(f"/bookings/{mine.pk}/").content.decode()
    holds = page.split('id="booking-holds"')[1].split("</table>")[0]
    assert (
        "gpu-c01" in holds and "40 cores · 320.0 GiB" in holds and ">88</span> / 96 cores" in holds
    )


@pytest.mark.browser
def test_it_shows_the_figures_in_the_browser_and_patches_them_live(
    transactional_db, asgi_server, browser_page
):
    alice, project = UserFactory(username="alice"), ProjectFactory(slug="vision")
    member(alice, project)
    mine, other = _site(alice, project)
    page = browser_page
    sign_in(page, asgi_server, "alice", "pw-secret-123")
    page.wait_for_selector("body[data-live-state='open']")
    node = "[data-node-line='gpu-c01'] summary [data-resources]"
    assert (
        " ".join(page.text_content(node).split()) == "· CPU 88 / 96 cores · memory 832 / 1024 GiB"
    )
    assert page.is_hidden("[data-node-line='gpu-c02'] summary [data-resources]")
    page.screenshot(path=str(ARTIFACTS / "node-resources-overview.png"), full_page=True)

    in_thread(booking_release, user=other.owner, booking_id=other.pk, now=timezone.now())
    wait_for(page, f"document.querySelector(\"{node} [data-resource='0']\").textContent === '40'")
    assert page.text_content(f"{node} [data-resource='2']") == "320"
    gauges = "[data-node-line='gpu-c01'] [data-node-resources]"  # the expanded node's
    assert " ".join(page.text_content(gauges).split()) == "CPU 40 / 96 cores Memory 320 / 1024 GiB"
    assert page.eval_on_selector(f"{gauges} [data-resource-meter='0']", "m => m.value") == 40

    page.goto(f"{asgi_server}/bookings/{mine.pk}/")
    cells = [
        " ".join(c.split()) for c in page.locator("#booking-holds tbody tr > *").all_text_contents()
    ]
    assert cells == ["gpu-c01", "40 cores · 320.0 GiB", "CPU 40 / 96 cores Memory 320 / 1024 GiB"]
    page.screenshot(path=str(ARTIFACTS / "node-resources-booking.png"), full_page=True)
