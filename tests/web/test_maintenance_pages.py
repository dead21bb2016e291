"""Maintenance windows on the pages: the calendar, the overview, a node's devices, a GPU."""

from datetime import timedelta

import pytest
from django.utils import timezone

from portal.models import MaintenanceWindow, Node
from portal.web.selectors import PENDING_REASONS
from scheduler import REASONS


@pytest.fixture
def client_in(client, user, project):
    client.force_login(user)
    return client


@pytest.fixture
def window(cluster):
    start = (timezone.now() + timedelta(days=2)).replace(hour=8, minute=0, second=0, microsecond=0)
    window = MaintenanceWindow.objects.create(
        reason="PDU swap", start=start, end=start + timedelta(hours=4)
    )
    window.nodes.set([cluster[0]])
    return window


def _row(body: str, uuid: str) -> str:
    return body.split(f'data-uuid-row="{uuid}"', 1)[1].split('<div class="tl-row"', 1)[0]


def test_it_draws_a_window_on_its_nodes_rows_and_offers_no_slot_in_it(client_in, cluster, window):
    day = window.start.strftime("%Y-%m-%d")
    body = client_in.get(f"/calendar/?view=day&day={day}").content.decode()
    a, b = cluster[0].gpus.first().uuid, cluster[1].gpus.first().uuid
    assert f"Maintenance window {window.pk}: PDU swap" in _row(body, a)
    assert "Maintenance window" not in _row(body, b)
    inside = f"/book/?start={day}T09:00"
    assert inside not in _row(body, a)
    assert inside in _row(body, b)
    assert f"/book/?start={day}T12:00" in _row(body, a)  # free again at its end


def test_it_lists_the_windows_on_the_overview_a_nodes_devices_and_a_gpu(client_in, cluster, window):
    overview = client_in.get("/").content.decode()
    assert "Maintenance" in overview and "PDU swap" in overview and "node-a" in overview
    node_a = client_in.get("/?fragment=node&node=node-a").content.decode()
    assert f'data-maintenance="{window.pk}"' in node_a
    node_b = client_in.get("/?fragment=node&node=node-b").content.decode()
    assert "data-maintenance" not in node_b
    gpu = cluster[0].gpus.first()
    assert "PDU swap" in client_in.get(f"/gpus/{gpu.pk}/").content.decode()


def test_it_says_when_a_node_is_in_maintenance(client_in, cluster, window):
    Node.objects.filter(pk=cluster[0].pk).update(state=Node.State.MAINTENANCE)
    body = client_in.get(f"/calendar/?week={window.start:%Y-%m-%d}").content.decode()
    assert "Node in maintenance: not bookable" in _row(body, cluster[0].gpus.first().uuid)


def test_it_explains_the_maintenance_reason_in_words():
    assert "maintenance" in REASONS
    assert "maintenance window" in PENDING_REASONS["maintenance"]


@pytest.mark.browser
@pytest.mark.parametrize(
    "path",
    ["/calendar/?view=day&day={day}", "/?node=node-a", "/gpus/{gpu}/"],
    ids=["calendar", "overview", "gpu"],
)
def test_it_shows_a_window_accessibly_in_the_browser(transactional_db, asgi_server, chromium, path):
    from tests.factories import ProjectFactory, UserFactory, make_node, member
    from tests.web.conftest import assert_accessible, sign_in

    alice = UserFactory(username="alice")
    member(alice, ProjectFactory(slug="vision"))
    node = make_node("node-a", gpus=2)
    start = (timezone.now() + timedelta(days=1)).replace(hour=8, minute=0, second=0, microsecond=0)
    window = MaintenanceWindow.objects.create(
        reason="PDU swap", start=start, end=start + timedelta(hours=4)
    )
    window.nodes.set([node])
    context = chromium.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    try:
        sign_in(page, asgi_server, "alice", "pw-secret-123")
        url = path.format(day=f"{start:%Y-%m-%d}", gpu=node.gpus.first().pk)
        assert page.goto(asgi_server + url).status == 200
        page.wait_for_load_state("networkidle")
        assert "PDU swap" in page.content()
        for scheme in ("light", "dark"):
            page.emulate_media(color_scheme=scheme)
            assert_accessible(page, label=f"{url} ({scheme})")
    finally:
        context.close()
