"""Recording notifications: who is told what, on which channel, after the change committed.

A command records a fact (portal.services.core.outbox); the subscribers here turn it into a
Notification row, in their own transaction after the command's, with one Delivery row per
recipient and channel that person picked (preferences, else the project's default, else the
site's). The notification is keyed by the fact, so a fact dispatched twice is told once. After
commit one Celery task per delivery sends it (portal.services.notify.delivery). Nothing here talks to
the outside world.
"""

import hashlib
import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import datetime

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import IntegrityError, transaction
from django.utils import timezone

from portal.models import (
    Booking,
    Channel,
    Delivery,
    Event,
    NodeAlert,
    Notification,
    NotificationContact,
    NotificationPreference,
    ProjectNotificationSettings,
)
from portal.services.access import permissions
from portal.services.core.jobs import job_enqueue
from portal.services.notify import arrays

log = logging.getLogger(__name__)

# Booking service events -> the notification event they give (others are not notable).
_BOOKING_EVENTS = {
    "submitted": Event.QUEUED,
    "started": Event.STARTED,
    "extended": Event.EXTENDED,
    "finished": Event.ENDED,
    "released": Event.ENDED,
    "cancelled": Event.ENDED,
    "expired": Event.ENDED,
    "preempted": Event.PREEMPTED,
    "requeued": Event.PREEMPTED,
    "failed": Event.FAILED,
}
ADMIN_EVENTS = (Event.NODE_DOWN, Event.FOREIGN_PROCESS)

# Who hears what, read once per project and user while recipients_cached() is on.
_recipients: ContextVar[dict | None] = ContextVar("notify_recipients", default=None)


@contextmanager
def recipients_cached() -> Iterator[None]:
    """Read each project's notification settings and each user's contacts and preferences once
    in this block (an allocation pass starts and preempts many bookings of the same people)."""
    token = _recipients.set({})
    try:
        yield
    finally:
        _recipients.reset(token)


def _read(key: tuple, load: Callable):
    cache = _recipients.get()
    if cache is None:
        return load()
    if key not in cache:
        cache[key] = load()
    return cache[key]


def booking_fact_notify(fact) -> None:
    """Subscriber: record the notification a booking fact gives (keyed by the fact); a job
    array's task is told as part of its array (portal.services.notify.arrays)."""
    event, bulk = fact.payload["event"], fact.payload.get("bulk", "")
    task = Booking.objects.filter(pk=fact.booking_id, array_parent__isnull=False).first()
    if task is not None and arrays.array_grouped(task, event, bulk=bulk):
        note = arrays.array_note(task, event, bulk=bulk)
        if note is not None:
            notification_record(
                event=note.event,
                now=timezone.now(),
                booking=note.booking,
                context=note.context,
                key=note.key,
            )
        return
    booking_event_record(
        booking_id=fact.booking_id,
        event=fact.payload["event"],
        cause=fact.payload.get("cause", ""),
        key=f"fact:{fact.pk}",
    )


def booking_event_record(
    *,
    booking_id: int,
    event: str,
    now: datetime | None = None,
    cause: str = "",
    key: str | None = None,
) -> int:
    """Record the notification a booking service event gives; returns its deliveries.

    A release caused by the idle reclaim is told as a reclaim. An as-soon-as-possible
    submission is told once the allocator has placed it in the queue
    (portal.services.notify.notify_scan), when its position and planned start are known.
    """
    kind = _BOOKING_EVENTS.get(event)
    if kind is None:
        return 0
    booking = Booking.objects.select_related("owner", "project").filter(pk=booking_id).first()
    if booking is None or (kind == Event.QUEUED and not booking.is_reservation):
        return 0
    if event == "released" and cause == "reclaim":
        kind = Event.RECLAIMED
    context = {"what": event, "detail": booking.state_detail}
    if kind == Event.QUEUED:
        context["planned_start"] = booking.start.isoformat()
    return notification_record(
        event=kind, booking=booking, now=now or timezone.now(), context=context, key=key
    )


def notification_record(
    *,
    event: str,
    now: datetime,
    booking: Booking | None = None,
    context: dict | None = None,
    key: str | None = None,
    admins: bool = False,
    users=(),
) -> int:
    """Record one notification and a delivery per recipient and channel; returns deliveries.

    With `key`, a notification already recorded under it is not recorded again (0). Recipients:
    the booking's owner and its project's channel, `users`, and staff when `admins`.
    """
    fields = {"event": event, "booking": booking, "key": key, "context": context or {}}
    if key is None:
        notification = Notification.objects.create(created=now, **fields)
    elif Notification.objects.filter(key=key).exists():
        return 0
    else:
        try:
            with transaction.atomic():
                notification = Notification.objects.create(created=now, **fields)
        except IntegrityError:
            return 0  # recorded a moment ago by a racing scan
    targets = _targets(notification, booking, list(users), admins)
    deliveries = Delivery.objects.bulk_create(
        [
            Delivery(
                notification=notification,
                event=event,
                channel=channel,
                user=user,
                recipient=recipient,
                idempotency_key=_idempotency_key(notification.pk, channel, recipient),
                created=now,
            )
            for user, channel, recipient in targets
        ]
    )  # the notification is new, so its keys are too
    ids = [d.pk for d in deliveries]
    if ids:
        transaction.on_commit(lambda: deliveries_enqueue(ids), robust=True)
    return len(deliveries)


def deliveries_enqueue(delivery_ids) -> None:
    """Queue one send task per delivery (after commit; the scan resends any left pending)."""
    for delivery_id in delivery_ids:
        try:
            job_enqueue("delivery_send", delivery_id)
        except Exception:  # the broker down: the scan sends it later; the others still go
            log.exception("could not queue delivery %s", delivery_id)


def _idempotency_key(notification_id: int, channel: str, recipient: str) -> str:
    digest = hashlib.sha256(recipient.encode()).hexdigest()[:24]
    return f"n{notification_id}-{channel}-{digest}"


def _targets(notification, booking, users, admins) -> list[tuple]:
    """(user or None, channel, recipient) for everyone this notification goes to, no repeats."""
    event = notification.event
    people = list(users)
    if booking is not None:
        people.append(booking.owner)
    if admins:
        site_wide = permissions.site_wide_users_filter("notify.site_events")
        people += list(get_user_model().objects.filter(site_wide, is_active=True).order_by("pk"))
    config = (
        _read(
            ("project", booking.project_id),
            lambda: ProjectNotificationSettings.objects.filter(
                project_id=booking.project_id
            ).first(),
        )
        if booking is not None
        else None
    )
    contacts = _contacts({p.pk for p in people})
    seen, targets = set(), []
    for person in people:
        defaults = (config.default_channels or {}) if config else {}
        for channel in _channels_on(person, event, defaults):
            recipient = _address(person, channel, contacts.get(person.pk))
            if recipient and (channel, recipient) not in seen:
                seen.add((channel, recipient))
                targets.append((person, channel, recipient))
    for channel, recipient in _shared_addresses(event, config, admins):
        if (channel, recipient) not in seen:
            seen.add((channel, recipient))
            targets.append((None, channel, recipient))
    return targets


def _shared_addresses(event: str, config, admins: bool) -> list[tuple[str, str]]:
    """The project's channel (if it takes this event) and, for admins' events, the site's Slack."""
    found = []
    if admins and settings.SLACK_WEBHOOK_URL:
        found.append((Channel.SLACK, settings.SLACK_WEBHOOK_URL))
    if config is None or event not in (config.channel_events or []):
        return found
    slack = config.slack_webhook_url or (settings.SLACK_BOT_TOKEN and config.slack_channel)
    if slack:
        found.append((Channel.SLACK, slack))
    if config.webhook_url:
        found.append((Channel.WEBHOOK, config.webhook_url))
    return found


def _contacts(user_ids: set[int]) -> dict[int, NotificationContact]:
    def load():
        return {c.user_id: c for c in NotificationContact.objects.filter(user_id__in=user_ids)}

    return _read(("contacts", frozenset(user_ids)), load)


def _channels_on(user, event: str, project_defaults: dict) -> list[str]:
    chosen = _read(
        ("preferences", user.pk, event),
        lambda: dict(
            NotificationPreference.objects.filter(user=user, event=event).values_list(
                "channel", "enabled"
            )
        ),
    )
    project_default = project_defaults.get(event)
    enabled = []
    for channel in Channel.values:
        if channel in chosen:
            on = chosen[channel]
        elif project_default is not None:
            on = channel in project_default
        else:
            on = (
                event in settings.NOTIFY_DEFAULT_EVENTS
                and channel in settings.NOTIFY_DEFAULT_CHANNELS
            )
        if on:
            enabled.append(channel)
    return enabled


def _address(user, channel: str, contact) -> str:
    if channel == Channel.EMAIL:
        return user.email
    if contact is None:
        return ""
    if channel == Channel.SLACK:
        if contact.slack_webhook_url:
            return contact.slack_webhook_url
        return contact.slack_user_id if settings.SLACK_BOT_TOKEN else ""
    return contact.webhook_url


def alert_notify(*, alert_id: int) -> bool:
    """Tell the owner of the booking a process intruded on, and the admins (foreign process)."""
    alert = NodeAlert.objects.select_related("node", "owner").filter(pk=alert_id).first()
    if alert is None:
        return False
    with transaction.atomic():
        notification_record(
            event=Event.FOREIGN_PROCESS,
            now=timezone.now(),
            booking=None,
            context={"alert": alert.pk},
            key=f"alert:{alert.pk}",
            admins=True,
            users=[alert.owner] if alert.owner else [],
        )
    return True


def node_down_fact_notify(fact) -> None:
    """Subscriber: tell the admins a node went down (keyed by the node and when)."""
    notification_record(
        event=Event.NODE_DOWN,
        now=datetime.fromisoformat(fact.payload["at"]),
        context={"node": fact.payload["hostname"], "detail": fact.payload["reason"]},
        key=f"node_down:{fact.node_id}:{fact.payload['at']}",
        admins=True,
    )
