"""The audit log: who did what, when, from where, with the values before and after."""

from django.conf import settings
from django.core.serializers.json import DjangoJSONEncoder
from django.db import models
from django.utils import timezone


class AppendOnlyError(RuntimeError):
    """An audit row was about to be changed or deleted; the log only grows."""


class AuditEvent(models.Model):
    """One action on the site: a booking command, a quota, membership, node or token change,
    a login. Append only: the model refuses updates and deletes, and so does a database trigger.

    Actor and project are kept by id without a database constraint, beside their names at the
    time, so that deleting a user or a project leaves its history readable and untouched.
    """

    class Via(models.TextChoices):
        WEB = "web", "Web page"
        API = "api", "API"
        ADMIN = "admin", "Admin"
        LINK = "link", "One-click link (email)"
        SLACK = "slack", "Slack button"
        SYSTEM = "system", "System"

    at = models.DateTimeField(default=timezone.now, db_index=True)
    actor = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.DO_NOTHING,
        db_constraint=False,
        related_name="+",
    )
    actor_name = models.CharField(max_length=150, blank=True)
    address = models.CharField(max_length=64, blank=True)
    via = models.CharField(max_length=8, choices=Via.choices)
    action = models.CharField(max_length=40, db_index=True)
    target_type = models.CharField(max_length=40, blank=True)
    target_id = models.CharField(max_length=64, blank=True)
    project = models.ForeignKey(
        "portal.Project",
        null=True,
        blank=True,
        on_delete=models.DO_NOTHING,
        db_constraint=False,
        related_name="+",
    )
    project_slug = models.CharField(max_length=64, blank=True)
    before = models.JSONField(null=True, blank=True, encoder=DjangoJSONEncoder)
    after = models.JSONField(null=True, blank=True, encoder=DjangoJSONEncoder)

    class Meta:
        ordering = ["-at", "-id"]
        indexes = [models.Index(fields=["project", "-at"], name="portal_audit_project_at")]

    def __str__(self) -> str:
        return f"{self.at:%Y-%m-%d %H:%M:%S} {self.actor_name or '-'} {self.action}"

    def save(self, *args, **kwargs):
        if self.pk is not None and not self._state.adding:
            raise AppendOnlyError("Audit events cannot be changed.")
        super().save(*args, **kwargs)

    def delete(self, *args, **kwargs):
        raise AppendOnlyError("Audit events cannot be deleted.")
