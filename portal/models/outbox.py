"""The outbox: one row per domain event (a fact) that a command recorded in its transaction."""

from django.db import models


class DomainEvent(models.Model):
    """A fact a command recorded with its own rows, dispatched to subscribers after commit.

    The row commits or rolls back with the command, so a fact is never lost and never sent for a
    change that did not happen. `payload` holds what subscribers need to know and cannot read
    back later, the cause above all ("released" by the owner, a one-click link or the idle
    reclaim). `done` names the subscribers that already ran, so a retry runs only the others.
    """

    kind = models.CharField(max_length=40)
    booking_id = models.BigIntegerField(null=True, blank=True)
    node_id = models.BigIntegerField(null=True, blank=True)
    payload = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField()
    dispatched_at = models.DateTimeField(null=True, blank=True)
    # A dispatcher claims the row until then (compare-and-set); one that died lets it lapse.
    claimed_until = models.DateTimeField(null=True, blank=True)
    done = models.JSONField(default=list, blank=True)
    attempts = models.PositiveIntegerField(default=0)
    last_error = models.CharField(max_length=300, blank=True, default="")

    class Meta:
        ordering = ["id"]
        indexes = [
            models.Index(
                fields=["created_at"],
                condition=models.Q(dispatched_at__isnull=True),
                name="portal_fact_undispatched",
            )
        ]

    def __str__(self) -> str:
        return f"{self.kind} #{self.pk} (booking {self.booking_id}, node {self.node_id})"
