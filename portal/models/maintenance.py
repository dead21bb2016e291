from django.conf import settings
from django.db import models
from django.db.models import F, Q

from portal.models.inventory import Node


class MaintenanceWindow(models.Model):
    """A span in which staff take nodes out of service, with the reason.

    It covers the nodes named, plus those of ``network_group`` (read afresh each time, so a
    node that joins the group joins the window); no node and no group: every node. The
    allocator places no booking on those nodes that would overlap the window
    (scheduler/calendar.py); at its start the nodes drain (``Node.State.MAINTENANCE``) and at
    its end they return to service (portal.services.fleet.maintenance). A window never ends a
    booking: those it collides with are listed and their owners told.
    """

    reason = models.CharField(max_length=200)
    start = models.DateTimeField()
    end = models.DateTimeField()
    nodes = models.ManyToManyField(Node, blank=True, related_name="maintenance_windows")
    network_group = models.CharField(
        max_length=64, blank=True, help_text="Every node of this network group (rack or switch)."
    )
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="+",
    )
    created = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["start", "id"]
        constraints = [
            models.CheckConstraint(
                condition=Q(end__gt=F("start")), name="%(app_label)s_%(class)s_end_after_start"
            )
        ]

    def __str__(self) -> str:
        return f"maintenance {self.pk}: {self.reason}"
