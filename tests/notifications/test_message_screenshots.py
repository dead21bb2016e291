"""The mail and the Slack message as a person sees them, rendered in Chromium (docs screenshots:
NOTIFY_SCREENSHOTS_DIR=docs/img writes them there)."""

import os
from pathlib import Path

import pytest
from django.db import transaction

from portal.models import Notification
from portal.services.notify.messages import email_parts, message_build, slack_payload
from portal.services.notify.notifications import booking_event_record
from tests.factories import make_active_booking, make_node
from tests.notifications.slack_preview import slack_preview_html
from tests.web.conftest import ARTIFACTS, CHROMIUM, CHROMIUM_ARGS

pytestmark = pytest.mark.django_db


def test_it_renders_the_mail_and_the_slack_message_with_their_buttons(owner, project, settings):
    pytest.importorskip("playwright")
    if not os.path.exists(CHROMIUM):
        pytest.skip("no chromium")
    settings.SITE_URL = "https://gpus.example.org"
    booking = make_active_booking(
        list(make_node("gpu-a01", gpus=2).gpus.all()), owner=owner, project=project, gpus=2
    )
    with transaction.atomic():
        booking_event_record(booking_id=booking.pk, event="started")
    message = message_build(Notification.objects.get(event="started"))
    _subject, _text, mail_html = email_parts(message)
    slack_html = slack_preview_html(slack_payload(message))
    out = Path(os.environ.get("NOTIFY_SCREENSHOTS_DIR") or ARTIFACTS)
    out.mkdir(parents=True, exist_ok=True)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 680, "height": 400})
        page.set_content(mail_html)
        assert page.get_by_role("link", name="Extend by an hour").is_visible()
        page.screenshot(path=str(out / "notification-email.png"), full_page=True)
        page.set_content(slack_html)
        assert page.get_by_text("Release now").is_visible()
        page.screenshot(path=str(out / "notification-slack.png"), full_page=True)
        browser.close()
