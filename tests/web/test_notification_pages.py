"""In a browser: a message's action link confirms with one button and acts; the settings page
saves a choice."""

import pytest

from portal.models import Booking, NotificationPreference
from portal.services.notify.booking_links import action_token
from tests.factories import UserFactory, make_active_booking, make_node
from tests.web.conftest import ARTIFACTS, sign_in

pytestmark = pytest.mark.browser


@pytest.fixture
def alice(transactional_db):
    user = UserFactory(username="alice")
    user.set_password("pw-secret-123")
    user.save()
    return user


def test_it_confirms_and_releases_from_a_link(alice, asgi_server, browser_page):
    booking = make_active_booking(list(make_node("gpu-a01", gpus=1).gpus.all()), owner=alice)
    url = f"{asgi_server}/actions/{action_token(booking=booking, action='release')}/"
    page = browser_page
    page.goto(url)
    page.screenshot(path=str(ARTIFACTS / "action-confirm.png"), full_page=True)
    assert Booking.objects.get(pk=booking.pk).state == "active"
    page.get_by_role("button", name="Release now").click()
    page.get_by_role("heading", name="Done: release now").wait_for()
    assert Booking.objects.get(pk=booking.pk).state == "finished"
    page.goto(url)
    page.get_by_role("heading", name="This link cannot be used").wait_for()
    assert "already used" in page.content()
    page.screenshot(path=str(ARTIFACTS / "action-used.png"), full_page=True)


def test_it_saves_choices_on_the_settings_page(alice, asgi_server, browser_page):
    page = browser_page
    sign_in(page, asgi_server, "alice", "pw-secret-123")
    page.goto(f"{asgi_server}/settings/notifications/")
    page.get_by_label("Started by slack").check()
    page.fill("#slack_user_id", "U024BE7LH")
    page.screenshot(path=str(ARTIFACTS / "notification-settings.png"), full_page=True)
    page.get_by_role("button", name="Save").click()
    page.get_by_text("Notification settings saved.").wait_for()
    assert NotificationPreference.objects.get(user=alice, event="started", channel="slack").enabled


def test_it_saves_a_message_per_array_task_on_the_settings_page(alice, asgi_server, browser_page):
    from portal.models import NotificationContact

    page = browser_page
    sign_in(page, asgi_server, "alice", "pw-secret-123")
    page.goto(f"{asgi_server}/settings/notifications/")
    box = page.get_by_label("A message for each task of a job array", exact=False)
    assert not box.is_checked()  # one message per array unless asked
    box.check()
    page.get_by_role("button", name="Save").click()
    page.get_by_text("Notification settings saved.").wait_for()
    assert NotificationContact.objects.get(user=alice).array_each_task is True
    assert page.get_by_label("A message for each task of a job array", exact=False).is_checked()
