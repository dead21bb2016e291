from django.conf import settings
from django.db import models
from django.db.models import F, Q

from portal.models.inventory import Node
from portal.models.projects import Project


class ProjectReservation(models.Model):
    """Capacity set aside for a project: ``gpus`` whole GPUs (of ``gpu_model`` if set, on
    ``nodes`` if named), or every GPU of ``nodes``, over [start, end), once or every week.

    Not a booking: no device is assigned here. The allocation pass expands it into windows
    (scheduler.holds) in which only the project's bookings may use the devices set aside;
    ``idle_release_minutes`` after a window opens, what no member booking uses is released.
    """

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="reservations")
    gpus = models.PositiveIntegerField(
        null=True, blank=True, help_text="Whole GPUs to set aside; empty: every GPU of the nodes."
    )
    gpu_model = models.CharField(max_length=64, blank=True)
    nodes = models.ManyToManyField(Node, blank=True, related_name="project_reservations")
    start = models.DateTimeField()
    end = models.DateTimeField()
    weekly = models.BooleanField(default=False, help_text="Repeat the window every week.")
    idle_release_minutes = models.PositiveIntegerField(
        null=True,
        blank=True,
        help_text="Release what no member booking uses this long after a window opens.",
    )
    note = models.CharField(max_length=200, blank=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True
    )
    created = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["start", "id"]
        constraints = [
            models.CheckConstraint(
                condition=Q(end__gt=F("start")), name="%(app_label)s_%(class)s_end_after_start"
            ),
            models.CheckConstraint(
                condition=Q(gpus__isnull=True) | Q(gpus__gte=1),
                name="%(app_label)s_%(class)s_gpus_positive",
            ),
        ]

    def __str__(self) -> str:
        what = f"{self.gpus} GPUs" if self.gpus else "nodes"
        return f"{self.project} {what} from {self.start:%Y-%m-%d %H:%M}" + (
            " weekly" if self.weekly else ""
        )
