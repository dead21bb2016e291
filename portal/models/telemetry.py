"""Device telemetry (raw samples and per-minute rollups) and the alerts agents raise."""

from django.conf import settings
from django.db import models
from django.db.models.functions import Coalesce

from portal.models.bookings import Booking
from portal.models.inventory import Node


class Sample(models.Model):
    """One raw reading of a device (whole GPU or MIG instance), kept for a day or so.

    Keyed by device UUID rather than a foreign key to Gpu/MigInstance: MIG instances come and go
    with re-partitioning, and history must outlive them. None means "not measured" (NVML reports
    no utilization for MIG instances) and is never turned into 0. Written with COPY in bulk.
    """

    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="+", db_index=False)
    uuid = models.CharField(max_length=96)
    time = models.DateTimeField()
    utilization_gpu = models.FloatField(null=True)
    utilization_memory = models.FloatField(null=True)
    memory_used_mib = models.IntegerField(null=True)
    memory_total_mib = models.IntegerField(null=True)
    temperature_c = models.FloatField(null=True)
    power_w = models.FloatField(null=True)

    class Meta:
        indexes = [
            models.Index(fields=["uuid", "time"], name="portal_sample_uuid_time"),
            models.Index(fields=["time"], name="portal_sample_time"),
        ]

    def __str__(self) -> str:
        return f"{self.uuid} at {self.time:%Y-%m-%d %H:%M:%S}"


class SampleMinute(models.Model):
    """The samples of one device in one minute, rolled up; kept for weeks.

    Recomputed from the raw samples of that minute and upserted, so rolling up twice never
    counts a sample twice.
    """

    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="+", db_index=False)
    uuid = models.CharField(max_length=96)
    minute = models.DateTimeField()
    samples = models.PositiveIntegerField()
    utilization_gpu_avg = models.FloatField(null=True)
    utilization_gpu_max = models.FloatField(null=True)
    utilization_memory_avg = models.FloatField(null=True)
    memory_used_mib_avg = models.FloatField(null=True)
    memory_used_mib_max = models.IntegerField(null=True)
    memory_total_mib = models.IntegerField(null=True)
    temperature_c_avg = models.FloatField(null=True)
    temperature_c_max = models.FloatField(null=True)
    power_w_avg = models.FloatField(null=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["uuid", "minute"], name="%(app_label)s_%(class)s_one_per_minute"
            )
        ]
        indexes = [models.Index(fields=["minute"], name="portal_sampleminute_minute")]

    def __str__(self) -> str:
        return f"{self.uuid} in {self.minute:%Y-%m-%d %H:%M}"


class NodeAlert(models.Model):
    """A process an agent objected to: on a device booked by someone else, or on no booking.

    One row per process: the node, kind, device, booking (`booking_key`: its id, 0 for none, so
    the uniqueness holds on every database and outlives the booking), pid and Unix user. A
    repeated report of it counts on that row (`count`, `last_seen`); `time` is the first.
    Rows not seen for TELEMETRY_ROLLUP_RETENTION_D days are pruned with the process rollups.
    """

    class Kind(models.TextChoices):
        FOREIGN_PROCESS = "foreign_process", "Process of someone else on a booked device"
        UNBOOKED_PROCESS = "unbooked_process", "Process on a device no booking holds"

    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="alerts")
    kind = models.CharField(max_length=20, choices=Kind.choices)
    time = models.DateTimeField(help_text="When the agent first saw it.")
    last_seen = models.DateTimeField(help_text="When the agent last reported it.")
    count = models.PositiveIntegerField(default=1, help_text="How often the agent reported it.")
    device_uuid = models.CharField(max_length=96, blank=True)
    pid = models.IntegerField(null=True, blank=True)
    user = models.CharField(max_length=64, blank=True, help_text="Unix user of the process.")
    action = models.CharField(max_length=8, blank=True, help_text="report, warn or kill.")
    detail = models.TextField(blank=True)
    booking = models.ForeignKey(
        Booking, on_delete=models.SET_NULL, null=True, blank=True, related_name="alerts"
    )
    booking_key = models.BigIntegerField(default=0)
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="+",
        help_text="Owner of the booking holding the device, if any.",
    )
    created = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-time", "-id"]
        constraints = [
            models.UniqueConstraint(
                models.F("node"),
                models.F("kind"),
                models.F("device_uuid"),
                models.F("booking_key"),
                Coalesce(models.F("pid"), models.Value(-1)),
                models.F("user"),
                name="%(app_label)s_%(class)s_one_per_process",
            )
        ]
        indexes = [models.Index(fields=["last_seen"], name="portal_nodealert_last_seen")]

    def __str__(self) -> str:
        return f"{self.kind} on {self.node}: pid {self.pid}"

    def save(self, *args, **kwargs):
        # Rows written one by one (the admin, fixtures) keep the fields the upsert keys on.
        self.last_seen = self.last_seen or self.time
        self.booking_key = self.booking_id or 0
        super().save(*args, **kwargs)


class ProcessUsage(models.Model):
    """One process seen on one device during one booking (or on no booking): a rollup of the
    agent's per-process readings, one row per process rather than one per sample.

    `booking_key` is the booking's id, 0 for none, so the uniqueness holds on every database.
    `foreign` is set when the process ran on a device no booking held; the pages also mark a
    process the agent reported as someone else's (NodeAlert with the same device and pid).
    """

    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="+", db_index=False)
    device_uuid = models.CharField(max_length=96)
    booking = models.ForeignKey(
        Booking, on_delete=models.SET_NULL, null=True, blank=True, related_name="processes"
    )
    booking_key = models.BigIntegerField(default=0)
    pid = models.IntegerField()
    user = models.CharField(max_length=64, blank=True)
    name = models.CharField(max_length=64, blank=True)
    first_seen = models.DateTimeField()
    last_seen = models.DateTimeField()
    peak_memory_mib = models.IntegerField(null=True)
    samples = models.PositiveIntegerField(default=1)
    foreign = models.BooleanField(default=False)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["device_uuid", "booking_key", "pid", "user", "name"],
                name="%(app_label)s_%(class)s_one_per_process",
            )
        ]
        indexes = [models.Index(fields=["last_seen"], name="portal_processusage_last_seen")]

    def __str__(self) -> str:
        return f"pid {self.pid} ({self.name}) of {self.user} on {self.device_uuid}"
