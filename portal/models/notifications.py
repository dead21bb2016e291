"""Notifications: what happened (Notification), each message sent about it (Delivery), who wants
what where (NotificationPreference, NotificationContact, ProjectNotificationSettings), the one-click
action links used (ActionUse) and idle bookings warned and reclaimed (IdleReclaim)."""

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models

from portal.models.bookings import Booking
from portal.models.projects import Project
from portal.outbound import destination_problem


def _destinations_clean(record, names: tuple[str, ...]) -> None:
    """Refuse a destination the portal may not contact (portal/outbound.py), naming the field."""
    problems = {
        name: destination_problem(getattr(record, name)) for name in names if getattr(record, name)
    }
    problems = {name: problem for name, problem in problems.items() if problem}
    if problems:
        raise ValidationError(problems)


class Event(models.TextChoices):
    """What a notification is about. The admin events go to staff, not to a booking's owner."""

    QUEUED = "queued", "Queued"
    MOVED = "moved", "Planned start moved"
    STARTING_SOON = "starting_soon", "Starting soon"
    STARTED = "started", "Started"
    EXTENDED = "extended", "Extended"
    ENDING_SOON = "ending_soon", "Ending soon"
    ENDED = "ended", "Ended"
    PREEMPTED = "preempted", "Preempted or requeued"
    FAILED = "failed", "Failed"
    IDLE = "idle", "Booked devices idle"
    RECLAIMED = "reclaimed", "Released for idleness"
    BUDGET = "budget", "Quota or budget nearly used"
    NODE_DOWN = "node_down", "Node down (admins)"
    FOREIGN_PROCESS = "foreign_process", "Foreign process (admins)"
    MAINTENANCE = "maintenance", "Maintenance window"


class Channel(models.TextChoices):
    EMAIL = "email", "Email"
    SLACK = "slack", "Slack"
    WEBHOOK = "webhook", "Webhook"


class Notification(models.Model):
    """One thing that happened and is worth telling someone (one per event occurrence).

    `key` makes an occurrence found by a periodic scan (ending soon, idle, budget) unique, so
    scanning twice records it once; events from a state change have no key (each is its own).
    """

    event = models.CharField(max_length=20, choices=Event.choices)
    booking = models.ForeignKey(
        Booking, on_delete=models.CASCADE, null=True, blank=True, related_name="notifications"
    )
    key = models.CharField(max_length=200, null=True, blank=True, unique=True)
    context = models.JSONField(default=dict, blank=True)
    created = models.DateTimeField()

    class Meta:
        ordering = ["-created", "-id"]
        indexes = [models.Index(fields=["booking", "event"], name="portal_notif_booking_event")]

    def __str__(self) -> str:
        return f"{self.event} (booking {self.booking_id})"


class Delivery(models.Model):
    """One message about one notification, to one address on one channel, and how sending went.

    `idempotency_key` is unique: the message is recorded once per notification, channel and
    address, and the sender moves it pending -> sending -> sent by compare-and-set, so a task run
    twice (a worker restarted, a retry racing) sends it at most once.
    """

    class Status(models.TextChoices):
        PENDING = "pending", "Pending"
        SENDING = "sending", "Sending"
        RETRYING = "retrying", "Retrying"
        SENT = "sent", "Sent"
        FAILED = "failed", "Failed"
        UNCERTAIN = "uncertain", "Uncertain (sender died mid-send)"

    notification = models.ForeignKey(
        Notification, on_delete=models.CASCADE, related_name="deliveries"
    )
    event = models.CharField(max_length=20, choices=Event.choices)
    channel = models.CharField(max_length=8, choices=Channel.choices)
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="+",
        help_text="Empty for a project's channel.",
    )
    recipient = models.CharField(max_length=300, help_text="Address, Slack id or channel, URL.")
    idempotency_key = models.CharField(max_length=200, unique=True)
    status = models.CharField(
        max_length=10, choices=Status.choices, default=Status.PENDING, db_index=True
    )
    attempts = models.PositiveIntegerField(default=0)
    last_error = models.TextField(blank=True)
    created = models.DateTimeField()
    claimed_at = models.DateTimeField(null=True, blank=True)
    sent_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created", "-id"]
        verbose_name_plural = "deliveries"

    def __str__(self) -> str:
        return f"{self.event} by {self.channel} to {self.recipient} ({self.status})"


class NotificationPreference(models.Model):
    """A user's choice for one event on one channel (no row: the project's or the site's default)."""

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="notification_preferences"
    )
    event = models.CharField(max_length=20, choices=Event.choices)
    channel = models.CharField(max_length=8, choices=Channel.choices)
    enabled = models.BooleanField()

    class Meta:
        ordering = ["user", "event", "channel"]
        constraints = [
            models.UniqueConstraint(
                fields=["user", "event", "channel"], name="%(app_label)s_%(class)s_one_per_choice"
            )
        ]

    def __str__(self) -> str:
        return f"{self.user}: {self.event} by {self.channel} {'on' if self.enabled else 'off'}"


class NotificationContact(models.Model):
    """Where a user is reached besides their email: Slack (bot DM or personal webhook), a webhook;
    and whether a job array's tasks are told one by one (else the array is told as one)."""

    user = models.OneToOneField(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="notification_contact"
    )
    slack_user_id = models.CharField(
        max_length=32, blank=True, help_text="Slack member id (U...), messaged by the site's bot."
    )
    slack_webhook_url = models.URLField(blank=True, help_text="Personal Slack incoming webhook.")
    webhook_url = models.URLField(blank=True, help_text="JSON webhook, signed with the secret.")
    webhook_secret = models.CharField(max_length=128, blank=True)
    array_each_task = models.BooleanField(
        default=False,
        help_text="A message per task of a job array; else one each when the array is "
        "submitted, its first task starts and all have ended.",
    )

    def __str__(self) -> str:
        return f"contact of {self.user}"

    def clean(self) -> None:
        _destinations_clean(self, ("slack_webhook_url", "webhook_url"))


class ProjectNotificationSettings(models.Model):
    """A project's channel (Slack, webhook), its members' default choices and its idle policy."""

    project = models.OneToOneField(
        Project, on_delete=models.CASCADE, related_name="notification_settings"
    )
    slack_channel = models.CharField(
        max_length=80, blank=True, help_text="Channel the site's bot posts to, e.g. #vision-gpus."
    )
    slack_webhook_url = models.URLField(blank=True, help_text="Or a channel's incoming webhook.")
    webhook_url = models.URLField(blank=True)
    webhook_secret = models.CharField(max_length=128, blank=True)
    channel_events = models.JSONField(
        default=list, blank=True, help_text='Events posted to the project channel, e.g. ["failed"].'
    )
    default_channels = models.JSONField(
        default=dict,
        blank=True,
        help_text='Members\' defaults by event, e.g. {"started": ["email", "slack"]}.',
    )
    idle_util_threshold = models.FloatField(
        null=True,
        blank=True,
        validators=[MinValueValidator(0), MaxValueValidator(100)],
        help_text="Utilization (%) under which a booking is idle. Empty: the site's.",
    )
    idle_minutes = models.PositiveIntegerField(
        null=True, blank=True, validators=[MinValueValidator(1)]
    )
    idle_grace_minutes = models.PositiveIntegerField(
        null=True, blank=True, validators=[MinValueValidator(1)]
    )

    class Meta:
        verbose_name_plural = "project notification settings"

    def __str__(self) -> str:
        return f"notifications of {self.project}"

    def clean(self) -> None:
        _destinations_clean(self, ("slack_webhook_url", "webhook_url"))


class ActionUse(models.Model):
    """A one-click action link that was used; its nonce is unique, so a link works once."""

    nonce = models.CharField(max_length=64, unique=True)
    booking = models.ForeignKey(Booking, on_delete=models.CASCADE, related_name="+")
    action = models.CharField(max_length=16)
    used_at = models.DateTimeField()

    def __str__(self) -> str:
        return f"{self.action} on booking {self.booking_id}"


class IdleReclaim(models.Model):
    """An idle booking warned, and what came of it: kept by its owner, busy again, or released."""

    class State(models.TextChoices):
        WARNED = "warned", "Warned"
        KEPT = "kept", "Kept by its owner"
        BUSY = "busy", "Busy again"
        RELEASED = "released", "Released"

    booking = models.ForeignKey(Booking, on_delete=models.CASCADE, related_name="idle_reclaims")
    state = models.CharField(max_length=10, choices=State.choices, default=State.WARNED)
    warned_at = models.DateTimeField()
    closed_at = models.DateTimeField(null=True, blank=True)
    detail = models.CharField(max_length=300, blank=True)

    class Meta:
        ordering = ["-warned_at", "-id"]
        constraints = [
            models.UniqueConstraint(
                fields=["booking"],
                condition=models.Q(state="warned"),
                name="%(app_label)s_%(class)s_one_open_warning",
            )
        ]

    def __str__(self) -> str:
        return f"idle booking {self.booking_id}: {self.state}"
