from django.conf import settings
from django.db import models
from django.db.models import Q

from portal.models.inventory import Gpu, MigInstance, mig_fraction
from portal.models.projects import Project


def mig_profile_slices(profile: str) -> int:
    """Compute slices of a MIG profile from its name: "3g.40gb" has 3 (NVIDIA's naming)."""
    head = profile.split("g.", 1)[0].rsplit(".", 1)[-1]
    return int(head) if head.isdigit() else 1


class Qos(models.TextChoices):
    """Quality of service: higher levels weigh more in priority and may preempt lower ones."""

    LOW = "low", "Low"
    NORMAL = "normal", "Normal"
    HIGH = "high", "High"


class BookingState(models.TextChoices):
    """Where a booking is in its life; Booking.State. Defined here so the CHECK can name it."""

    PENDING = "pending", "Pending"
    PLANNED = "planned", "Planned"
    ACTIVE = "active", "Active"
    FINISHED = "finished", "Finished"
    CANCELLED = "cancelled", "Cancelled"
    PREEMPTED = "preempted", "Preempted"
    FAILED = "failed", "Failed"
    EXPIRED = "expired", "Expired"


class Booking(models.Model):
    """A request for GPUs or one MIG slice, and its life from submission to end.

    Two kinds: an advance reservation has a fixed window (start, end) and is placed on devices at
    submission; an as-soon-as-possible request has a duration and waits in the queue (pending) until
    the allocator starts it. The devices held are the booking's Allocation rows.
    """

    State = BookingState

    LIVE_STATES = (State.PENDING, State.PLANNED, State.ACTIVE)

    class Interactive(models.TextChoices):
        """What a booking runs for its owner to use in the browser, instead of (or without) a command."""

        NONE = "none", "None"
        JUPYTERLAB = "jupyterlab", "JupyterLab"
        TERMINAL = "terminal", "Terminal"

    class SessionState(models.TextChoices):
        """Where an interactive session is: blank until the booking starts."""

        STARTING = "starting", "Starting"
        RUNNING = "running", "Running"
        FAILED = "failed", "Failed"
        STOPPED = "stopped", "Stopped"

    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="bookings"
    )
    project = models.ForeignKey(Project, on_delete=models.PROTECT, related_name="bookings")
    gpus = models.PositiveIntegerField(
        default=0, help_text="Whole GPUs asked for; 0 with a MIG profile."
    )
    mig_profile = models.CharField(max_length=32, blank=True)
    # A fraction of one shared GPU (gpus=1, no MIG profile): its compute share, the memory it
    # needs, or both (docs/scheduling.md, "Shared GPUs"; null: a whole device).
    gpu_fraction = models.FloatField(
        null=True, blank=True, help_text="Share of one shared GPU's compute, 0 < f < 1."
    )
    gpu_memory_mib = models.PositiveIntegerField(
        null=True, blank=True, help_text="GPU memory it needs on one shared GPU, in MiB."
    )
    # CPU cores and host memory on each node it holds GPUs of (docs/scheduling.md, "Cores and
    # memory"); null: the site default per GPU, else the node's share in proportion to the GPUs
    # it holds there (scheduler.resources.node_demand, the one rule).
    cpus = models.PositiveIntegerField(
        null=True, blank=True, help_text="CPU cores per node. Empty: the default for its GPUs."
    )
    memory_mib = models.PositiveIntegerField(
        null=True, blank=True, help_text="Host memory (MiB) per node. Empty: the default."
    )
    gpu_model = models.CharField(max_length=64, blank=True)
    mixed_models = models.BooleanField(
        default=False,
        help_text="Any GPU models will do; without it, 2 or more GPUs with no model asked are "
        "of one model.",
    )
    start = models.DateTimeField(
        null=True, blank=True, help_text="Fixed window start (reservation)."
    )
    end = models.DateTimeField(null=True, blank=True, help_text="Fixed window end (reservation).")
    duration_s = models.PositiveIntegerField()
    qos = models.CharField(max_length=8, choices=Qos.choices, default=Qos.NORMAL)
    preemptible = models.BooleanField(default=False)
    # Elastic quotas (docs/scheduling.md, "Borrowing"): this run started past a concurrency
    # limit on devices nobody within their limits could use, and may be reclaimed.
    borrowed = models.BooleanField(
        default=False, help_text="Running past its quota's concurrency limit: preemptible."
    )
    borrowed_past = models.CharField(
        max_length=200, blank=True, help_text='The limits it borrows past, e.g. "project vision".'
    )
    command = models.TextField(blank=True)

    state = models.CharField(
        max_length=10, choices=State.choices, default=State.PENDING, db_index=True
    )
    submitted_at = models.DateTimeField()
    started_at = models.DateTimeField(null=True, blank=True)
    ended_at = models.DateTimeField(null=True, blank=True)
    state_detail = models.CharField(max_length=300, blank=True)

    # What the last allocation pass said about a pending booking.
    planned_start = models.DateTimeField(null=True, blank=True)
    queue_position = models.PositiveIntegerField(null=True, blank=True)
    # Fits every allocator reason (scheduler.types.REASONS), "project_reservation" the longest.
    pending_reason = models.CharField(max_length=24, blank=True)
    priority = models.JSONField(null=True, blank=True)

    exit_code = models.IntegerField(null=True, blank=True)
    log_tail = models.TextField(blank=True)
    # When the site last sent it back to the queue (preempted, or its node failed): allocations
    # that started before then belong to an earlier run, not to the one it shows.
    requeued_at = models.DateTimeField(null=True, blank=True)

    # POST bookings/ with an Idempotency-Key header: the key, unique per owner, and the SHA-256
    # of the canonical request, so a retry gets this booking and another request a refusal.
    idempotency_key = models.CharField(max_length=200, blank=True)
    request_digest = models.CharField(max_length=64, blank=True)

    # An interactive session the node runs for the booking, opened through the portal's proxy
    # (docs/interactive.md). The token is the session server's secret: it never reaches the user.
    interactive = models.CharField(
        max_length=16, choices=Interactive.choices, default=Interactive.NONE
    )
    session_state = models.CharField(max_length=10, choices=SessionState.choices, blank=True)
    session_detail = models.CharField(max_length=300, blank=True)
    session_host = models.CharField(max_length=253, blank=True)
    session_port = models.PositiveIntegerField(null=True, blank=True)
    session_token = models.CharField(max_length=128, blank=True)

    # A batch job's environment (docs/distributed.md): where it runs (blank: the owner's home),
    # its own variables ({name: value}), the signal it gets `signal_before_s` seconds before its
    # end or at an early stop (blank: the site's JOB_SIGNAL_DEFAULT), the port its ranks meet
    # on while it runs, and how many times it went back to the queue and started again.
    workdir = models.CharField(max_length=1024, blank=True)
    env = models.JSONField(default=dict, blank=True)
    signal_name = models.CharField(max_length=8, blank=True)
    signal_before_s = models.PositiveIntegerField(null=True, blank=True)
    master_port = models.PositiveIntegerField(null=True, blank=True)
    restart_count = models.PositiveIntegerField(default=0)
    # A task of a job array (docs/distributed.md): every task is a booking of its own, all
    # pointing at the array's first task (itself included), which names the array. The spec
    # ("0-99%10") is kept on every task: its running limit is read by each pass.
    array_parent = models.ForeignKey(
        "self", on_delete=models.PROTECT, null=True, blank=True, related_name="array_tasks"
    )
    array_task_id = models.PositiveIntegerField(null=True, blank=True)
    array_spec = models.CharField(max_length=200, blank=True)
    # Run the command in this container image on the node's runtime (docs/containers.md).
    image = models.CharField(max_length=500, blank=True)

    class Meta:
        ordering = ["-submitted_at", "-id"]
        constraints = [
            models.UniqueConstraint(
                fields=["array_parent", "array_task_id"],
                name="%(app_label)s_%(class)s_array_task_once",
            ),
            models.CheckConstraint(
                condition=Q(array_parent__isnull=True, array_task_id__isnull=True, array_spec="")
                | Q(array_parent__isnull=False, array_task_id__isnull=False) & ~Q(array_spec=""),
                name="%(app_label)s_%(class)s_array_task_whole",
            ),
            models.UniqueConstraint(
                fields=["owner", "idempotency_key"],
                condition=~Q(idempotency_key=""),
                name="%(app_label)s_%(class)s_idempotency_key_once",
            ),
            models.CheckConstraint(
                condition=Q(gpus__gte=1, mig_profile="") | Q(gpus=0) & ~Q(mig_profile=""),
                name="%(app_label)s_%(class)s_gpus_or_mig",
            ),
            models.CheckConstraint(
                condition=Q(gpu_fraction__isnull=True) | Q(gpu_fraction__gt=0, gpu_fraction__lt=1),
                name="%(app_label)s_%(class)s_fraction_in_range",
            ),
            models.CheckConstraint(
                condition=Q(gpu_fraction__isnull=True, gpu_memory_mib__isnull=True)
                | Q(gpus=1, mig_profile="") & ~Q(gpu_memory_mib=0),
                name="%(app_label)s_%(class)s_fraction_of_one_gpu",
            ),
            models.CheckConstraint(
                condition=Q(start__isnull=True, end__isnull=True)
                | Q(start__isnull=False, end__isnull=False, end__gt=models.F("start")),
                name="%(app_label)s_%(class)s_window_ordered",
            ),
            models.CheckConstraint(
                condition=Q(duration_s__gt=0), name="%(app_label)s_%(class)s_duration_positive"
            ),
            # The moves between these states are services.booking.transitions.TRANSITIONS.
            models.CheckConstraint(
                condition=Q(state__in=BookingState.values),
                name="%(app_label)s_%(class)s_state_known",
            ),
        ]

    def __str__(self) -> str:
        return f"booking {self.pk} ({self.state})"

    @property
    def is_reservation(self) -> bool:
        return self.start is not None

    @property
    def is_fractional(self) -> bool:
        """It asks for a fraction of one shared GPU (a compute share, memory, or both)."""
        return self.gpu_fraction is not None or self.gpu_memory_mib is not None

    @property
    def gpu_equivalents(self) -> float:
        """GPUs this booking counts for in quotas: its whole GPUs, its MIG profile's share of
        a GPU (known from the profile's name, before any slice is allocated; no query), or its
        compute share of a shared GPU. A memory-only request's share depends on the GPU it
        gets (memory / the GPU's memory): it counts as 1 here, the most it can be; once placed
        its allocation's ``fraction`` holds the share charged."""
        if self.gpu_fraction is not None:
            return self.gpu_fraction
        if self.gpus:
            return float(self.gpus)
        return mig_fraction(mig_profile_slices(self.mig_profile))

    def describe_request(self) -> str:
        if self.is_fractional:  # "0.25 of a shared GPU, 20480 MiB", "20480 MiB of a shared GPU"
            share = f"{self.gpu_fraction:g}" if self.gpu_fraction is not None else ""
            memory = f"{self.gpu_memory_mib} MiB" if self.gpu_memory_mib is not None else ""
            what = f"{share or memory} of a shared GPU" + (
                f", {memory}" if share and memory else ""
            )
            return what + (f" {self.gpu_model}" if self.gpu_model else "") + self._host_asked()
        what = (
            f"{self.gpus} GPU" + ("s" if self.gpus != 1 else "")
            if self.gpus
            else f"MIG {self.mig_profile}"
        )
        return what + (f" {self.gpu_model}" if self.gpu_model else "") + self._host_asked()

    def _host_asked(self) -> str:
        """ ", 16 cores, 64 GiB per node": the cores and memory asked ("" where none was)."""
        parts = []
        if self.cpus is not None:
            parts.append(f"{self.cpus} core" + ("s" if self.cpus != 1 else ""))
        if self.memory_mib is not None:
            mib = self.memory_mib
            whole = mib >= 1024 and mib % 1024 == 0
            parts.append(f"{mib // 1024} GiB" if whole else f"{mib} MiB")
        return f", {', '.join(parts)} per node" if parts else ""


class BookingDependency(models.Model):
    """The booking may start only after ``target`` ended the way ``kind`` says (Slurm's
    ``--dependency``): afterok (successfully: finished), afternotok (any other end) or
    afterany. The allocator plans it (pending reason "dependency"); one that can never be met
    ends the booking."""

    class Kind(models.TextChoices):
        """How the target must end; the names are Slurm's."""

        AFTER_OK = "afterok", "after it finished successfully"
        AFTER_ANY = "afterany", "after it ended"
        AFTER_NOT_OK = "afternotok", "after it ended unsuccessfully"

    booking = models.ForeignKey(Booking, on_delete=models.CASCADE, related_name="dependencies")
    target = models.ForeignKey(Booking, on_delete=models.PROTECT, related_name="dependents")
    kind = models.CharField(max_length=10, choices=Kind.choices)

    class Meta:
        ordering = ["booking", "target"]
        constraints = [
            models.UniqueConstraint(
                fields=["booking", "target"], name="%(app_label)s_%(class)s_once"
            ),
            models.CheckConstraint(
                condition=Q(kind__in=["afterok", "afterany", "afternotok"]),
                name="%(app_label)s_%(class)s_kind_known",
            ),
            models.CheckConstraint(
                condition=~Q(booking=models.F("target")),
                name="%(app_label)s_%(class)s_not_itself",
            ),
        ]

    def __str__(self) -> str:
        return f"booking {self.booking_id} {self.kind}:{self.target_id}"


class Allocation(models.Model):
    """One device held by a booking over [start, end).

    A device is a whole GPU (mig_instance empty) or one MIG instance of `gpu`. The allocation
    occupies the GPU's compute slices [slot_start, slot_end): all seven for a whole GPU, the MIG
    instance's placement otherwise. PostgreSQL fills the slots itself (a trigger, from the MIG
    instance, on every insert or device change) and refuses two live allocations on one GPU whose
    slots and periods both overlap (exclusion constraint portal_allocation_no_overlap, migrations
    0002, 0004 and 0032; SQLite has no such thing and leaves the slots empty). So a whole GPU and
    any of its slices, or a slice and one of a changed MIG layout, never go to two bookings at
    once; fractions of a shared GPU (share < 1) do not clash with each other, only with a whole
    GPU's allocation.
    When a booking ends, its allocations stop being live and `end` is cut to the real end.
    """

    booking = models.ForeignKey(Booking, on_delete=models.CASCADE, related_name="allocations")
    gpu = models.ForeignKey(Gpu, on_delete=models.PROTECT, related_name="allocations")
    mig_instance = models.ForeignKey(
        MigInstance, on_delete=models.PROTECT, null=True, blank=True, related_name="allocations"
    )
    start = models.DateTimeField()
    end = models.DateTimeField()
    fraction = models.FloatField(
        help_text="GPU-equivalents of the device: 1, slices/7, or the share of a shared GPU."
    )
    # A fraction of a shared GPU: its compute share (< 1) and the memory it holds; a whole
    # device holds 1.0 and no memory figure. The exclusion constraint (migration 0032) keeps a
    # whole device's allocations apart from every other on its GPU, fractions included; the
    # sum of shares and of memory on a shared GPU is checked under the start lock.
    share = models.FloatField(default=1.0, help_text="Compute share of its GPU: 1, or 0 < s < 1.")
    gpu_memory_mib = models.PositiveIntegerField(
        null=True, blank=True, help_text="GPU memory a share holds, in MiB (empty: whole device)."
    )
    live = models.BooleanField(default=True)
    # Held by a borrowed run (Booking.borrowed): accounting splits its GPU-hours.
    borrowed = models.BooleanField(default=False)
    mean_utilization = models.FloatField(
        null=True,
        blank=True,
        help_text="Mean GPU utilization (0-1) over the allocation, measured when it ended; "
        "empty while live or when nothing was measured (MIG slices).",
    )
    slot_start = models.PositiveSmallIntegerField(null=True, editable=False)
    slot_end = models.PositiveSmallIntegerField(null=True, editable=False)
    charged_until = models.DateTimeField(
        null=True,
        blank=True,
        editable=False,
        help_text="Its use up to this time is in the fair-share totals (FairshareUsage).",
    )

    class Meta:
        ordering = ["start", "id"]
        indexes = [
            models.Index(fields=["live", "end"], name="portal_alloc_live_end"),
            # The allocations a pass still has to charge: not yet counted to their end.
            models.Index(
                fields=["start"],
                name="portal_alloc_uncharged",
                condition=Q(charged_until__isnull=True) | Q(charged_until__lt=models.F("end")),
            ),
        ]
        constraints = [
            models.CheckConstraint(
                condition=Q(end__gt=models.F("start")), name="%(app_label)s_%(class)s_ordered"
            ),
            models.CheckConstraint(
                condition=Q(share__gt=0, share__lte=1), name="%(app_label)s_%(class)s_share_range"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.device_label} for booking {self.booking_id}"

    @property
    def device_label(self) -> str:
        return str(self.mig_instance) if self.mig_instance_id else str(self.gpu)

    @property
    def device_uuid(self) -> str:
        return self.mig_instance.uuid if self.mig_instance_id else self.gpu.uuid
