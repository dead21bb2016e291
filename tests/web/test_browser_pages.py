"""The calendar and the queue in headless Chromium: a free slot opens Book with its window, and
the queue page follows the queue live."""

from datetime import timedelta

import pytest
from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.utils import timezone

from portal.models import Booking
from tests.factories import ProjectFactory, QuotaFactory, UserFactory, make_node, member
from tests.web.conftest import in_thread, sign_in, wait_for

pytestmark = pytest.mark.browser
PASSWORD = "pw-secret-123"


@pytest.fixture
def alice(transactional_db):
    user = UserFactory(username="alice")
    project = ProjectFactory(slug="vision", name="Vision lab")
    member(user, project)
    QuotaFactory(project=project, max_gpus=16)
    make_node("node-a", gpus=2, model="H100-80GB")
    return user


def test_it_books_a_free_hour_from_the_day_view(alice, asgi_server, browser_page):
    page = browser_page
    tomorrow = timezone.now().date() + timedelta(days=1)
    sign_in(page, asgi_server, "alice", PASSWORD)
    page.goto(f"{asgi_server}/calendar/?view=day&day={tomorrow:%Y-%m-%d}")
    assert page.locator(".tl-tick-hour").count() == 24
    slots = page.locator(".tl-row[data-kind=gpus] .tl-slot")
    assert slots.count() == 2 * 24  # two free GPUs, every hour of tomorrow
    slots.nth(9).click()
    page.wait_for_url("**/book/?start=*")
    assert page.input_value("#id_start") == f"{tomorrow:%Y-%m-%d}T09:00"
    assert page.input_value("#id_end") == f"{tomorrow:%Y-%m-%d}T10:00"
    assert page.is_checked("#id_when_1")
    assert page.input_value("#id_gpu_model") == "H100-80GB"


def _queued(owner) -> Booking:
    booking = Booking.objects.create(
        owner=owner,
        project=owner.projects.get(),
        gpus=2,
        duration_s=3600,
        submitted_at=timezone.now(),
        queue_position=1,
        pending_reason="resources",
        state_detail="Waiting for 2 free H100-80GB GPUs.",
    )
    async_to_sync(get_channel_layer().group_send)("queue", {"type": "queue.changed"})
    return booking


def test_it_shows_a_new_queued_request_on_the_queue_page_live(alice, asgi_server, browser_page):
    page = browser_page
    sign_in(page, asgi_server, "alice", PASSWORD)
    page.goto(f"{asgi_server}/queue/")
    page.wait_for_selector("body[data-live-state='open']")
    assert "Nothing is queued." in page.text_content("[data-fragment=queue]")
    booking = in_thread(_queued, alice)
    wait_for(page, f"!!document.querySelector('tr[data-booking=\"{booking.pk}\"]')")
    assert "Waiting for 2 free H100-80GB GPUs." in page.text_content("[data-fragment=queue]")


def test_it_draws_a_project_reservation_on_its_lane_of_the_calendar(
    alice, asgi_server, browser_page
):
    from portal.models import Project, ProjectReservation

    tomorrow = timezone.now().date() + timedelta(days=1)
    start = timezone.now().replace(
        year=tomorrow.year, month=tomorrow.month, day=tomorrow.day, hour=10, minute=0
    )
    in_thread(
        lambda: ProjectReservation.objects.create(
            project=Project.objects.get(slug="vision"),
            gpus=2,
            start=start,
            end=start + timedelta(hours=2),
        )
    )
    page = browser_page
    sign_in(page, asgi_server, "alice", PASSWORD)
    page.goto(f"{asgi_server}/calendar/?view=day&day={start:%Y-%m-%d}")
    bar = page.locator(".tl-reservations .tl-bar.state-reserved")
    assert bar.count() == 1
    assert "vision: 2 GPUs" in bar.get_attribute("title")
    box = bar.bounding_box()
    assert box is not None and box["width"] > 10  # placed and sized by its data-left/width
