from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import MinValueValidator
from django.db import models
from django.db.models import Q


class Project(models.Model):
    """A team that books GPUs together; quotas and fair share are counted per project."""

    slug = models.SlugField(max_length=64, unique=True)
    name = models.CharField(max_length=200)
    description = models.TextField(blank=True)
    members = models.ManyToManyField(
        settings.AUTH_USER_MODEL, through="Membership", related_name="projects"
    )
    created = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["slug"]

    def __str__(self) -> str:
        return self.slug


class Membership(models.Model):
    """A user's place in a project: members book; managers also see all its bookings and may
    cancel or release them (portal.services.access.permissions.CAN, docs/roles.md)."""

    class Role(models.TextChoices):
        MEMBER = "member", "Member"
        MANAGER = "manager", "Manager"

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="memberships")
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships"
    )
    role = models.CharField(max_length=16, choices=Role.choices, default=Role.MEMBER)
    # Set when a group mapping rule made this membership at sign-in: such memberships follow the
    # user's groups and go when no rule grants them any more. Manual ones are never touched.
    granted_by_rule = models.BooleanField(
        default=False,
        help_text="Made by a group mapping rule at sign-in; removed when no rule grants it.",
    )

    class Meta:
        ordering = ["project", "user"]
        constraints = [
            models.UniqueConstraint(
                fields=["project", "user"], name="%(app_label)s_%(class)s_unique_member"
            )
        ]

    def __str__(self) -> str:
        return f"{self.user} in {self.project} ({self.role})"


def _list_of_strings(value) -> None:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ValidationError('Enter a list of names, e.g. ["H100-80GB"].')


class Quota(models.Model):
    """Limits of a project, or a per-user override of them inside one project.

    A row with no user holds the project's limits; a row with a user overrides, field by field,
    the limits that user gets in that project (a blank field means "as the project").
    Concurrent GPUs count a MIG slice as its fraction of a GPU (3g.40gb = 3/7).
    """

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="quotas")
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.CASCADE,
        null=True,
        blank=True,
        related_name="quota_overrides",
        help_text="Leave empty for the project's own limits.",
    )
    max_gpus = models.FloatField(
        null=True,
        blank=True,
        validators=[MinValueValidator(0)],
        help_text="Most GPUs held at once (MIG slices count fractionally). Empty: no limit.",
    )
    gpu_hours_budget = models.FloatField(
        null=True,
        blank=True,
        validators=[MinValueValidator(0)],
        help_text="GPU-hours per rolling period. Empty: no limit.",
    )
    budget_period_days = models.PositiveIntegerField(
        null=True,
        blank=True,
        validators=[MinValueValidator(1)],
        help_text="Length of the rolling budget period in days (default 30).",
    )
    max_duration_s = models.PositiveIntegerField(
        null=True,
        blank=True,
        validators=[MinValueValidator(60)],
        help_text="Longest single booking in seconds. Empty: the site maximum.",
    )
    allowed_models = models.JSONField(
        null=True,
        blank=True,
        validators=[_list_of_strings],
        help_text='GPU models allowed, e.g. ["A100-80GB"]. Empty: all.',
    )
    allowed_qos = models.JSONField(
        null=True,
        blank=True,
        validators=[_list_of_strings],
        help_text='QOS levels allowed, e.g. ["low", "normal"]. Empty: all.',
    )
    fairshare_shares = models.FloatField(
        null=True,
        blank=True,
        validators=[MinValueValidator(0)],
        help_text="Fair-share shares of the project (project row only; default 1).",
    )
    borrowing = models.BooleanField(
        null=True,
        blank=True,
        help_text="Past max_gpus, bookings may start borrowed on idle devices (preemptible, "
        "reclaimed when others need them). Empty: the site default (QUOTA_BORROWING).",
    )
    max_borrow_gpus = models.FloatField(
        null=True,
        blank=True,
        validators=[MinValueValidator(0)],
        help_text="Most GPUs borrowed at once past max_gpus. Empty: no limit.",
    )
    # Cores and host memory held at once, as max_gpus limits GPUs (docs/scheduling.md, "Cores
    # and memory"); what a booking holds on a node is scheduler.resources.node_demand.
    max_cpus = models.PositiveIntegerField(
        null=True, blank=True, help_text="Most CPU cores held at once. Empty: no limit."
    )
    max_memory_mib = models.PositiveIntegerField(
        null=True, blank=True, help_text="Most host memory (MiB) held at once. Empty: no limit."
    )

    class Meta:
        ordering = ["project", "user"]
        constraints = [
            models.UniqueConstraint(
                fields=["project"],
                condition=Q(user__isnull=True),
                name="%(app_label)s_%(class)s_one_per_project",
            ),
            models.UniqueConstraint(
                fields=["project", "user"], name="%(app_label)s_%(class)s_one_per_user"
            ),
        ]

    def __str__(self) -> str:
        return f"quota {self.project}" + (f" / {self.user}" if self.user_id else "")
