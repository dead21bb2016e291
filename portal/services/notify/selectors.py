"""Reads for the notification pages and API: a user's preferences (writes live in `preferences`,
`notifications`, `delivery`)."""

from django.conf import settings

from portal.models import Channel, Event, NotificationContact, NotificationPreference
from portal.services.access import permissions

# Events about the site, not a booking: offered to those the roles table lets choose them.
SITE_EVENTS = ("node_down", "foreign_process")


def preferences_get(*, user) -> dict:
    """Each event with, per channel, whether the user gets it there (their choice or the site's
    default; a project's default applies to its bookings where the user chose nothing)."""
    chosen = {
        (p.event, p.channel): p.enabled for p in NotificationPreference.objects.filter(user=user)
    }
    events = []
    for event, label in Event.choices:
        if event in SITE_EVENTS and not permissions.can(user, "notify.site_events"):
            continue
        site = event in settings.NOTIFY_DEFAULT_EVENTS
        events.append(
            {
                "event": event,
                "label": label,
                "channels": {
                    c: chosen.get((event, c), site and c in settings.NOTIFY_DEFAULT_CHANNELS)
                    for c in Channel.values
                },
                "chosen": any((event, c) in chosen for c in Channel.values),
            }
        )
    contact = NotificationContact.objects.filter(user=user).first() or NotificationContact()
    return {
        "email": user.email,
        "events": events,
        "array_each_task": contact.array_each_task,
        "contact": {
            "slack_user_id": contact.slack_user_id,
            "slack_webhook_url": contact.slack_webhook_url,
            "webhook_url": contact.webhook_url,
            "webhook_secret_set": bool(contact.webhook_secret),
        },
    }
