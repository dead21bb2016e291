from django.conf import settings
from django.db import models

from portal.models.projects import Project


class FairshareUsage(models.Model):
    """A user's fair-share use in a project: decayed GPU-seconds as of ``as_of``, kept running.

    Each allocation pass decays the totals to its own time and adds the use since the last one
    (``Allocation.charged_until`` says how far each allocation is counted), so a pass reads the
    allocations still being charged, not four half-lives of history. ``half_life_s`` and
    ``charge`` are the policy the totals were kept under; a pass under another policy builds them
    again from the history.
    """

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="+")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    gpu_seconds = models.FloatField(default=0.0)
    as_of = models.DateTimeField()
    half_life_s = models.FloatField()
    charge = models.CharField(max_length=16)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["project", "user"], name="%(app_label)s_%(class)s_one_per_user"
            )
        ]

    def __str__(self) -> str:
        return f"{self.user_id}@{self.project_id}: {self.gpu_seconds:.0f} GPU-s at {self.as_of}"
