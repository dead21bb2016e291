"""A user's notification choices (event x channel) and addresses: read and change them."""

from django.core.exceptions import ValidationError
from django.db import transaction

from portal.errors import ValidationFailed
from portal.models import Channel, Event, NotificationContact, NotificationPreference
from portal.services.notify.selectors import preferences_get

CONTACT_FIELDS = ("slack_user_id", "slack_webhook_url", "webhook_url", "webhook_secret")


def preferences_set(
    *, user, choices: dict, contact: dict | None = None, array_each_task: bool | None = None
) -> dict:
    """Store the user's choices ({event: {channel: bool}}), addresses and whether a job array's
    tasks are told one by one (`array_each_task`; None: unchanged); all or nothing."""
    rows = _rows(user, choices)
    record = None
    if contact is not None or array_each_task is not None:
        record = NotificationContact.objects.filter(user=user).first() or NotificationContact(
            user=user
        )
    if array_each_task is not None:
        if not isinstance(array_each_task, bool):
            raise ValidationFailed.field("array_each_task", "must be true or false.")
        record.array_each_task = array_each_task
    if contact is not None:
        for name, value in contact.items():
            if name not in CONTACT_FIELDS:
                raise ValidationFailed.field(f"contact.{name}", "is not a contact field.")
            setattr(record, name, (value or "").strip())
    if record is not None:
        try:
            record.full_clean()
        except ValidationError as exc:
            fields = {f"contact.{k}": " ".join(v) for k, v in exc.message_dict.items()}
            raise ValidationFailed("Check the addresses.", fields=fields) from exc
    with transaction.atomic():
        for event, channel, enabled in rows:
            NotificationPreference.objects.update_or_create(
                user=user, event=event, channel=channel, defaults={"enabled": enabled}
            )
        if record is not None:
            record.save()
    return preferences_get(user=user)


def _rows(user, choices) -> list[tuple[str, str, bool]]:
    if not isinstance(choices, dict):
        raise ValidationFailed.field("preferences", "must map events to {channel: true/false}.")
    rows = []
    for event, channels in choices.items():
        if event not in Event.values:
            raise ValidationFailed.field(f"preferences.{event}", "is not an event.")
        if not isinstance(channels, dict):
            raise ValidationFailed.field(f"preferences.{event}", "must map channels to true/false.")
        for channel, enabled in channels.items():
            if channel not in Channel.values:
                raise ValidationFailed.field(f"preferences.{event}.{channel}", "is not a channel.")
            if not isinstance(enabled, bool):
                raise ValidationFailed.field(
                    f"preferences.{event}.{channel}", "must be true or false."
                )
            rows.append((event, channel, enabled))
    return rows
