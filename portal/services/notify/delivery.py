"""Sending one recorded delivery: email, Slack (bot or webhook) or a signed JSON webhook.

At most once per delivery: the sender claims the row (pending or retrying -> sending, by
compare-and-set) before it sends, and marks it sent after. A task run again for a delivery
already claimed does nothing, so a worker restarted mid-send, or a retry racing, never sends a
second copy. The price is honest: a sender killed in the middle of a send leaves the row
'sending'; the scan marks it 'uncertain' for an admin (the message may or may not have left).
Each message carries the delivery's idempotency key (Message-ID, X-GPU-Portal-Delivery) so a
receiver can drop a copy too.
"""

import hashlib
import hmac
import json
import logging
import urllib.error
import urllib.request
from datetime import datetime, timedelta

from django.conf import settings
from django.core.mail import BadHeaderError, EmailMultiAlternatives
from django.db.models import F

from portal import outbound
from portal.models import Channel, Delivery, NotificationContact, ProjectNotificationSettings
from portal.services.core import counters
from portal.services.notify.messages import (
    email_parts,
    message_build,
    slack_payload,
    webhook_payload,
)

log = logging.getLogger(__name__)
Status = Delivery.Status
SIGNATURE_HEADER = "X-GPU-Portal-Signature-256"


class SendFailed(Exception):
    """A send that did not go through; `retry` says whether trying again may help."""

    def __init__(self, message: str, *, retry: bool = True):
        super().__init__(message)
        self.retry = retry


def delivery_send(*, delivery_id: int, now: datetime) -> str:
    """Send one delivery if nobody has; returns its status after. Raises SendFailed when a
    retry is due (the caller waits retry_backoff(attempts) and calls again)."""
    claimed = Delivery.objects.filter(
        pk=delivery_id, status__in=(Status.PENDING, Status.RETRYING)
    ).update(status=Status.SENDING, attempts=F("attempts") + 1, claimed_at=now)
    delivery = Delivery.objects.select_related("notification__booking", "user").get(pk=delivery_id)
    if not claimed:
        return delivery.status
    try:
        _send(delivery)
    except SendFailed as exc:
        return _failed(delivery, exc)
    except Exception as exc:
        log.exception("delivery %s could not be built or sent", delivery_id)
        return _failed(delivery, SendFailed(f"{type(exc).__name__}: {exc}", retry=False))
    Delivery.objects.filter(pk=delivery_id, status=Status.SENDING).update(
        status=Status.SENT, sent_at=now, last_error=""
    )
    return Status.SENT


def _failed(delivery: Delivery, exc: SendFailed) -> str:
    counters.counter_add(f"notification_failures:{delivery.channel}")
    final = not exc.retry or delivery.attempts >= settings.NOTIFY_MAX_ATTEMPTS
    status = Status.FAILED if final else Status.RETRYING
    Delivery.objects.filter(pk=delivery.pk, status=Status.SENDING).update(
        status=status, last_error=str(exc)[:2000]
    )
    if not final:
        raise exc
    return status


def retry_backoff(attempts: int) -> float:
    """Seconds before the next try: doubling from NOTIFY_RETRY_BACKOFF_S, at most an hour."""
    return min(settings.NOTIFY_RETRY_BACKOFF_S * 2 ** max(attempts - 1, 0), 3600.0)


def deliveries_due(*, now: datetime) -> list[int]:
    """Deliveries to send again now: pending ones never picked up (the broker was down at
    commit) and retrying ones whose backoff has passed (in-process mode retries only so; with a
    worker this backs up Celery's own retry, and the claim keeps it to one send). Marks those
    whose sender died mid-send 'uncertain', never to be sent again."""
    timeout = timedelta(seconds=4 * settings.NOTIFY_SEND_TIMEOUT_S + 60)
    Delivery.objects.filter(status=Status.SENDING, claimed_at__lt=now - timeout).update(
        status=Status.UNCERTAIN, last_error="the sender stopped in the middle of sending"
    )
    waiting = Delivery.objects.filter(status=Status.PENDING, created__lt=now - timeout)
    due = list(waiting.values_list("pk", flat=True)[:500])
    retrying = Delivery.objects.filter(status=Status.RETRYING).values_list(
        "pk", "attempts", "claimed_at"
    )
    due += [
        pk
        for pk, attempts, claimed_at in retrying[:500]
        if claimed_at + timedelta(seconds=retry_backoff(attempts)) <= now
    ]
    return due


def _send(delivery: Delivery) -> None:
    message = message_build(delivery.notification)
    if message.booking is None or delivery.user_id != message.booking.owner_id:
        # A project channel or an admin reads along: the buttons act as the owner, so only the
        # owner's own messages carry them.
        message.actions = []
    if delivery.channel == Channel.EMAIL:
        _send_email(delivery, message)
    elif delivery.channel == Channel.SLACK:
        _send_slack(delivery.recipient, slack_payload(message))
    else:
        body = webhook_payload(message, event=delivery.event, delivery_key=delivery.idempotency_key)
        _send_webhook(delivery, body)


def _send_email(delivery: Delivery, message) -> None:
    subject, text, html = email_parts(message)
    domain = settings.DEFAULT_FROM_EMAIL.rpartition("@")[2] or "localhost"
    mail = EmailMultiAlternatives(
        subject,
        text,
        settings.DEFAULT_FROM_EMAIL,
        [delivery.recipient],
        headers={"Message-ID": f"<{delivery.idempotency_key}@{domain}>"},
    )
    mail.attach_alternative(html, "text/html")
    try:
        mail.send(fail_silently=False)
    except BadHeaderError as exc:  # the message itself is wrong: trying again will not help
        raise SendFailed(f"email: {exc}", retry=False) from exc
    except Exception as exc:  # smtplib, socket and backend errors alike: all worth a retry
        raise SendFailed(f"email: {exc}") from exc


def _send_slack(recipient: str, payload: dict) -> None:
    if recipient.startswith(("http://", "https://")):
        _post_user_set(recipient, payload, {})
        return
    headers = {"Authorization": f"Bearer {settings.SLACK_BOT_TOKEN}"}
    answer = _post(
        f"{settings.SLACK_API_URL}/chat.postMessage", {"channel": recipient, **payload}, headers
    )
    try:
        result = json.loads(answer or b"{}")
    except ValueError as exc:
        raise SendFailed("slack: the API answered something that is not JSON") from exc
    if not result.get("ok"):
        error = result.get("error", "unknown error")
        raise SendFailed(f"slack: {error}", retry=error in ("ratelimited", "internal_error"))


def webhook_signature(secret: str, body: bytes) -> str:
    """The signature header's value: sha256=<hex HMAC-SHA256 of the body with the secret>."""
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def _send_webhook(delivery: Delivery, payload: dict) -> None:
    body = json.dumps(payload, sort_keys=True).encode()
    headers = {
        "X-GPU-Portal-Event": delivery.event,
        "X-GPU-Portal-Delivery": delivery.idempotency_key,
    }
    secret = _webhook_secret(delivery)
    if secret:
        headers[SIGNATURE_HEADER] = webhook_signature(secret, body)
    _post_user_set(delivery.recipient, body, headers)


def _webhook_secret(delivery: Delivery) -> str:
    if delivery.user_id:
        contact = NotificationContact.objects.filter(user_id=delivery.user_id).first()
        return contact.webhook_secret if contact else ""
    booking = delivery.notification.booking
    config = ProjectNotificationSettings.objects.filter(
        project_id=booking.project_id if booking else None
    ).first()
    return config.webhook_secret if config else ""


def _body(payload) -> bytes:
    return payload if isinstance(payload, bytes) else json.dumps(payload).encode()


_JSON = {"Content-Type": "application/json; charset=utf-8"}


def _refused_status(url: str, status: int) -> SendFailed:
    # 4xx other than 429 will not get better by trying again; 5xx and 429 may.
    return SendFailed(f"HTTP {status} from {url}", retry=status >= 500 or status == 429)


def _post_user_set(url: str, payload, headers: dict) -> bytes:
    """POST to a destination a user set (portal/outbound.py: public addresses only, checked
    at send time, no redirects). A refused destination fails for good."""
    try:
        answer = outbound.destination_post(
            url, _body(payload), {**_JSON, **headers}, timeout=settings.NOTIFY_SEND_TIMEOUT_S
        )
    except outbound.DestinationRefused as exc:
        raise SendFailed(f"{url} refused: {exc}", retry=False) from exc
    except outbound.DestinationUnreachable as exc:
        raise SendFailed(str(exc)) from exc
    if 300 <= answer.status < 400:
        raise SendFailed(
            f"HTTP {answer.status} from {url}: redirects are not followed", retry=False
        )
    if answer.status >= 400:
        raise _refused_status(url, answer.status)
    return answer.body


def _post(url: str, payload, headers: dict) -> bytes:
    """POST to the site's own Slack API (SLACK_API_URL, set by the operator)."""
    request = urllib.request.Request(
        url, data=_body(payload), headers={**_JSON, **headers}, method="POST"
    )
    try:
        with urllib.request.urlopen(request, timeout=settings.NOTIFY_SEND_TIMEOUT_S) as response:
            return response.read()
    except urllib.error.HTTPError as exc:
        raise _refused_status(url, exc.code) from exc
    except OSError as exc:
        raise SendFailed(f"{url}: {exc}") from exc
