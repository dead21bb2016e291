"""Email and Slack messages: queue events and node alerts. Called from tasks, after commit, never
in a transaction. All user-facing message text lives here."""

import json
import logging
import urllib.request

from django.conf import settings
from django.core.mail import send_mail

from portal.models import Booking, NodeAlert
from portal.services import metrics

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
        sent = send_mail(
            text,
            f"{text}\n\n{link}\n",
            settings.DEFAULT_FROM_EMAIL,
            [booking.owner.email],
            fail_silently=True,
        )
        if not sent:
            metrics.counter_add("notification_failures:email")
    slack_post(f"{booking.owner.username} ({booking.project.slug}): {text} <{link}|open>")
    return True


def alert_notify(*, alert_id: int) -> bool:
    """Email the owner of the booking a process intruded on, and post to the site's Slack."""
    alert = NodeAlert.objects.select_related("node", "owner").filter(pk=alert_id).first()
    if alert is None:
        return False
    subject = f"GPU alert on {alert.node}: {alert.get_kind_display()}"
    body = f"{alert.detail}\n\nAction taken by the agent: {alert.action or 'report'}.\n"
    if alert.owner and alert.owner.email:
        sent = send_mail(
            subject, body, settings.DEFAULT_FROM_EMAIL, [alert.owner.email], fail_silently=True
        )
        if not sent:
            metrics.counter_add("notification_failures:email")
    slack_post(f"{subject}: {alert.detail}")
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
        metrics.counter_add("notification_failures:slack")
