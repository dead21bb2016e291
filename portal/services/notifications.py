"""Email and Slack messages on queue events. Called from tasks, after commit, never in a transaction."""

import json
import logging
import urllib.request

from django.conf import settings
from django.core.mail import send_mail

from portal.models import Booking

log = logging.getLogger(__name__)

_SUBJECTS = {
    "submitted": "Booking {id} reserved: {what} from {start}",
    "started": "Booking {id} is active: {what}",
    "finished": "Booking {id} finished",
    "preempted": "Booking {id} was preempted",
    "requeued": "Booking {id} is back in the queue: {detail}",
    "failed": "Booking {id} failed: {detail}",
    "expired": "Booking {id} expired: {detail}",
}


def booking_notify(*, booking: Booking, event: str) -> bool:
    """Tell the owner (email) and the site channel (Slack) about an event; False if not notable."""
    if event == "submitted" and not booking.is_reservation:
        return False
    template = _SUBJECTS.get(event)
    if template is None:
        return False
    text = template.format(
        id=booking.pk,
        what=booking.describe_request(),
        detail=booking.state_detail or "see the portal",
        start=f"{booking.start:%Y-%m-%d %H:%M} UTC" if booking.start else "",
    )
    link = f"{settings.SITE_URL}/bookings/{booking.pk}/"
    if booking.owner.email:
        send_mail(
            text,
            f"{text}\n\n{link}\n",
            settings.DEFAULT_FROM_EMAIL,
            [booking.owner.email],
            fail_silently=True,
        )
    slack_post(f"{booking.owner.username} ({booking.project.slug}): {text} <{link}|open>")
    return True


def slack_post(text: str) -> None:
    """Post to the site's Slack incoming webhook, if configured; failures are logged, not raised."""
    if not settings.SLACK_WEBHOOK_URL:
        return
    body = json.dumps({"text": text}).encode()
    request = urllib.request.Request(
        settings.SLACK_WEBHOOK_URL, data=body, headers={"Content-Type": "application/json"}
    )
    try:
        urllib.request.urlopen(request, timeout=5).close()
    except OSError as exc:
        log.warning("Slack notification failed: %s", exc)
