"""The queue page (squeue for the portal), the staff panel and the favicon."""

from datetime import timedelta

import pytest
from django.utils import timezone

from portal.models import Membership, Node, NodeAlert
from portal.services.inventory.telemetry_cache import latest_store
from tests.factories import BookingFactory, ProjectFactory, UserFactory, make_node, member
from tests.web.test_pages import reading


def _pending(owner, project, position, **fields):
    return BookingFactory(
        owner=owner,
        project=project,
        gpus=2,
        queue_position=position,
        planned_start=timezone.now() + timedelta(hours=position),
        pending_reason="resources",
        state_detail=f"Waiting for 2 free GPUs (#{position})",
        priority={"age": 3, "qos": 10, "size": 1, "total": 114, "fairshare": 100},
        **fields,
    )


@pytest.fixture
def queue(db, user, project):
    """Alice's two requests, a project-mate's, and a stranger's in another project."""
    mate, stranger = UserFactory(username="bob"), UserFactory(username="eve")
    member(mate, project)
    other = ProjectFactory(slug="physics")
    member(stranger, other)
    return {
        "mine2": _pending(user, project, 3),
        "mine1": _pending(user, project, 1),
        "mate": _pending(mate, project, 2),
        "stranger": _pending(stranger, other, 4),
    }


def test_it_lists_my_pending_bookings_in_queue_order_with_reason_and_priority(client, user, queue):
    client.force_login(user)
    body = client.get("/queue/").content.decode()
    mine1, mine2 = queue["mine1"].pk, queue["mine2"].pk
    assert body.index(f"#{mine1} 2 GPUs") < body.index(f"#{mine2} 2 GPUs")
    assert "Waiting for 2 free GPUs (#1)" in body
    assert "fair share 100" in body and "<strong>114</strong>" in body
    assert f"{queue['mine1'].planned_start:%Y-%m-%d %H:%M}" in body
    # A member sees only their own; the whole queue's length is still told.
    assert f"/bookings/{queue['mate'].pk}/" not in body
    assert f"/bookings/{queue['stranger'].pk}/" not in body
    assert "2 shown of 4 queued" in body


def test_it_shows_a_manager_the_projects_queue_and_staff_all(client, user, project, queue):
    Membership.objects.filter(user=user, project=project).update(role=Membership.Role.MANAGER)
    client.force_login(user)
    body = client.get("/queue/").content.decode()
    assert f"/bookings/{queue['mate'].pk}/" in body
    assert f"/bookings/{queue['stranger'].pk}/" not in body
    client.force_login(UserFactory(username="root", is_staff=True))
    body = client.get("/queue/").content.decode()
    assert all(f"/bookings/{b.pk}/" in body for b in queue.values())


def test_it_renders_the_queue_fragment_for_live_updates(client, user, queue):
    client.force_login(user)
    body = client.get("/queue/?fragment=queue").content.decode()
    assert "<html" not in body and f"#{queue['mine1'].pk} " in body


def test_it_keeps_the_staff_panel_from_non_staff(client, user, db):
    assert client.get("/staff/").status_code == 302  # anonymous: sign in first
    client.force_login(user)
    assert client.get("/staff/").status_code == 403
    assert b'href="/admin/"' not in client.get("/queue/").content


def test_it_shows_staff_node_state_and_open_alerts(client, db):
    up = make_node("gpu-up", gpus=2, model="H100-80GB")
    down = make_node("gpu-down", gpus=1, state=Node.State.DOWN)
    down.state_reason = "agent silent for 5 minutes"
    down.save()
    gpu = up.gpus.order_by("index").first()
    now = timezone.now()
    still, gone = (
        NodeAlert.objects.create(
            node=up,
            kind=NodeAlert.Kind.UNBOOKED_PROCESS,
            time=now - timedelta(minutes=m),
            device_uuid=gpu.uuid,
            pid=pid,
            user="mallory",
            action="report",
            detail=f"pid {pid} on an unbooked device",
        )
        for pid, m in ((4242, 5), (5151, 30))
    )
    latest_store({gpu.uuid: reading(processes=[{"pid": 4242, "user": "mallory"}])})
    client.force_login(UserFactory(username="root", is_staff=True))
    response = client.get("/staff/")
    assert response.status_code == 200
    body = response.content.decode()
    # Down nodes first, with their reason; GPUs counted per model.
    assert body.index("gpu-down") < body.index("gpu-up")
    assert "agent silent for 5 minutes" in body and "2 × H100-80GB" in body
    # Only the alert whose process still runs is open.
    assert f"/admin/portal/nodealert/{still.pk}/change/" in body
    assert f"/admin/portal/nodealert/{gone.pk}/change/" not in body
    assert "gpu-up/gpu0" in body
    assert 'href="/admin/"' in body


def test_it_shows_an_alert_first_seen_long_ago_and_still_reported_with_its_count(client, db):
    node = make_node("gpu-rep", gpus=1)
    gpu = node.gpus.get()
    now = timezone.now()
    alert = NodeAlert.objects.create(
        node=node,
        kind=NodeAlert.Kind.UNBOOKED_PROCESS,
        time=now - timedelta(days=30),  # before the panel's window: its last report counts
        last_seen=now - timedelta(minutes=1),
        count=3,
        device_uuid=gpu.uuid,
        pid=4242,
    )
    latest_store({gpu.uuid: reading(processes=[{"pid": 4242, "user": "mallory"}])})
    client.force_login(UserFactory(username="root", is_staff=True, is_superuser=True))
    body = client.get("/staff/").content.decode()
    assert f"/admin/portal/nodealert/{alert.pk}/change/" in body and "reported 3 times" in body
    admin = client.get("/admin/portal/nodealert/").content.decode()
    assert f"/admin/portal/nodealert/{alert.pk}/change/" in admin


def test_it_serves_a_favicon_at_the_usual_address(client, db):
    response = client.get("/favicon.ico")
    assert response.status_code == 302
    assert response["Location"].startswith("/static/portal/icon")
    assert response["Location"].endswith(".svg")


def test_it_shows_an_array_task_and_its_dependencies_on_the_queue_page(client, user, project):
    from portal.models import Booking, BookingDependency

    client.force_login(user)
    first = _pending(user, project, 1)
    Booking.objects.filter(pk=first.pk).update(pending_reason="dependency", state_detail="")
    Booking.objects.filter(pk=first.pk).update(
        array_parent_id=first.pk, array_task_id=0, array_spec="0-9%2"
    )
    target = BookingFactory(owner=user, project=project, state=Booking.State.ACTIVE)
    BookingDependency.objects.create(booking=first, target=target, kind="afterok")
    body = client.get("/queue/").content.decode()
    assert f"array #{first.pk} task 0 (0-9%2)" in body
    assert f'after afterok:<a href="/bookings/{target.pk}/">#{target.pk}</a>' in body
    assert "It starts after other bookings end" in body
