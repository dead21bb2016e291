from django.conf import settings
from django.db import models

from portal.models.inventory import Gpu


class MigLayoutChange(models.Model):
    """A new MIG layout for one GPU in MIG mode, and how far it got.

    Staff ask for it (or the allocator proposes it, MIG_AUTO_LAYOUT, and staff approve it). The
    allocation pass plans it at the earliest time all of the GPU's slices are free and plans no
    booking on them across that time; at that time it tells the node's agent, which destroys the
    old instances, creates the new ones and registers again. The register retires the old
    slices (kept, with their history) and adds the new ones; the change is then done, or failed
    with the reason. ``layout`` is the placed layout, ``previous`` the one it replaces.
    """

    class State(models.TextChoices):
        PROPOSED = "proposed", "Proposed (awaiting approval)"
        REQUESTED = "requested", "Requested"
        PLANNED = "planned", "Planned"
        APPLYING = "applying", "Applying"
        DONE = "done", "Done"
        FAILED = "failed", "Failed"
        CANCELLED = "cancelled", "Cancelled"

    OPEN = (State.PROPOSED, State.REQUESTED, State.PLANNED, State.APPLYING)
    # The ones the allocator plans around (a proposal holds nothing until approved).
    HOLDING = (State.REQUESTED, State.PLANNED, State.APPLYING)

    gpu = models.ForeignKey(Gpu, on_delete=models.PROTECT, related_name="mig_changes")
    state = models.CharField(max_length=10, choices=State.choices, default=State.REQUESTED)
    # [{"profile": "3g.40gb", "start": 0}, ...] by start, as scheduler.mig_layout placed it.
    layout = models.JSONField()
    previous = models.JSONField(default=list, blank=True)
    planned_at = models.DateTimeField(
        null=True, blank=True, help_text="When its slices are all free: the change happens then."
    )
    detail = models.CharField(
        max_length=300, blank=True, help_text="Why it failed, or why proposed."
    )
    requested_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
        help_text="Empty: proposed by the allocator (MIG_AUTO_LAYOUT).",
    )
    created = models.DateTimeField(auto_now_add=True)
    applying_since = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created", "-id"]
        constraints = [
            models.UniqueConstraint(
                fields=["gpu"],
                condition=models.Q(state__in=["proposed", "requested", "planned", "applying"]),
                name="%(app_label)s_%(class)s_one_open",
            ),
        ]

    def __str__(self) -> str:
        profiles = "+".join(item["profile"] for item in self.layout)
        return f"MIG layout {profiles} on GPU {self.gpu_id} ({self.state})"
