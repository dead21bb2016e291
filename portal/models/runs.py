from django.db import models

from portal.models.bookings import Booking
from portal.models.inventory import Node


class NodeRun(models.Model):
    """What one node's process of a booking did in one run: its rank, exit code and output.

    A booking runs one process per node it holds devices on (docs/distributed.md); the booking
    ends failed as soon as one of them fails, naming the node. A requeued booking's next run has
    the next `restart` (Booking.restart_count), so earlier runs stay as they were.
    """

    class State(models.TextChoices):
        RUNNING = "running", "Running"
        EXITED = "exited", "Exited"
        STOPPED = "stopped", "Stopped"

    booking = models.ForeignKey(Booking, on_delete=models.CASCADE, related_name="node_runs")
    node = models.ForeignKey(Node, on_delete=models.PROTECT, related_name="runs")
    restart = models.PositiveIntegerField(default=0)
    rank = models.PositiveSmallIntegerField()
    state = models.CharField(max_length=8, choices=State.choices, default=State.RUNNING)
    exit_code = models.IntegerField(null=True, blank=True)
    log_tail = models.TextField(blank=True)
    detail = models.CharField(max_length=300, blank=True)
    ended_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["booking", "restart", "rank", "id"]
        constraints = [
            models.UniqueConstraint(
                fields=["booking", "restart", "node"], name="%(app_label)s_%(class)s_once"
            ),
        ]

    def __str__(self) -> str:
        return f"booking {self.booking_id} rank {self.rank} on node {self.node_id}"
