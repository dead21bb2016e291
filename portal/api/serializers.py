"""Input and output serializers. Inputs reject unknown fields; outputs are plain views of models.

List endpoints render dozens of rows a request, and DRF's generic field-by-field rendering was most
of their cost; so the output serializers declare their fields (for validation of the shape and the
OpenAPI schema) and render with a plain function, checked to match the generic rendering.
"""

from datetime import timedelta

from django.utils import timezone
from rest_framework import serializers

from portal.models import ApiToken, Booking, Gpu, MigInstance, Node, Qos
from portal.services.sessions import session_view
from portal.services.telemetry import SAMPLE_VALUES

MAX_SECONDS = 10 * 365 * 86400


class StrictSerializer(serializers.Serializer):
    """A serializer that refuses fields it does not know, so a typo is an error, not ignored."""

    def to_internal_value(self, data):
        if not isinstance(data, dict):
            raise serializers.ValidationError({"non_field_errors": ["Expected a JSON object."]})
        unknown = sorted(set(data) - set(self.fields))
        if unknown:
            raise serializers.ValidationError({name: ["Unknown field."] for name in unknown})
        return super().to_internal_value(data)


class TokenCreateInput(StrictSerializer):
    username = serializers.CharField(max_length=150)
    password = serializers.CharField(max_length=256, style={"input_type": "password"})
    name = serializers.CharField(max_length=100, required=False, allow_blank=True)


class TokenCreatedOutput(serializers.Serializer):
    token = serializers.CharField(help_text="Shown once: store it now.")
    id = serializers.IntegerField()
    name = serializers.CharField()


class TokenOutput(serializers.ModelSerializer):
    class Meta:
        model = ApiToken
        fields = ["id", "name", "prefix", "created", "last_used"]


class BookingCreateInput(StrictSerializer):
    project = serializers.SlugField(required=False, allow_blank=False, max_length=64)
    gpus = serializers.IntegerField(required=False, min_value=1, max_value=4096)
    mig_profile = serializers.CharField(required=False, max_length=32)
    gpu_model = serializers.CharField(required=False, max_length=64)
    start = serializers.DateTimeField(required=False)
    end = serializers.DateTimeField(required=False)
    duration_s = serializers.IntegerField(required=False, min_value=60, max_value=MAX_SECONDS)
    qos = serializers.ChoiceField(choices=Qos.choices, required=False, default=Qos.NORMAL)
    preemptible = serializers.BooleanField(required=False, default=False)
    command = serializers.CharField(
        required=False, allow_blank=True, max_length=10000, trim_whitespace=False
    )
    interactive = serializers.ChoiceField(
        choices=Booking.Interactive.choices,
        required=False,
        help_text="Run JupyterLab or a terminal on the booked devices, opened through the portal.",
    )


class BookingExtendInput(StrictSerializer):
    by_s = serializers.IntegerField(min_value=60, max_value=MAX_SECONDS)


def iso(value, tz=None) -> str | None:
    """A datetime as DRF's DateTimeField renders it: ISO 8601 in the current zone, UTC as Z.

    Pass `tz` (timezone.get_current_timezone()) when rendering many: looking it up is not free.
    """
    if not value:
        return None
    text = value.astimezone(tz or timezone.get_current_timezone()).isoformat()
    return text[:-6] + "Z" if text.endswith("+00:00") else text


def allocation_row(allocation, tz) -> dict:
    return {
        "device": allocation.device_label,
        "uuid": allocation.device_uuid,
        "node": allocation.gpu.node.hostname,
        "start": iso(allocation.start, tz),
        "end": iso(allocation.end, tz),
    }


class AllocationOutput(serializers.Serializer):
    device = serializers.CharField(source="device_label")
    uuid = serializers.CharField(source="device_uuid")
    node = serializers.CharField(source="gpu.node.hostname")
    start = serializers.DateTimeField()
    end = serializers.DateTimeField()


class SessionOutput(serializers.Serializer):
    """An interactive booking's session: state, a sentence, and the portal URL once running."""

    label = serializers.CharField()
    state = serializers.CharField()
    detail = serializers.CharField()
    url = serializers.CharField()


class BookingOutput(serializers.ModelSerializer):
    owner = serializers.CharField(source="owner.username")
    project = serializers.CharField(source="project.slug")
    devices = serializers.SerializerMethodField()
    cuda_visible_devices = serializers.SerializerMethodField()
    session = serializers.SerializerMethodField()

    class Meta:
        model = Booking
        fields = [
            "id",
            "owner",
            "project",
            "state",
            "state_detail",
            "gpus",
            "mig_profile",
            "gpu_model",
            "start",
            "end",
            "duration_s",
            "qos",
            "preemptible",
            "command",
            "submitted_at",
            "started_at",
            "ended_at",
            "planned_start",
            "queue_position",
            "pending_reason",
            "priority",
            "exit_code",
            "log_tail",
            "interactive",
            "session",
            "devices",
            "cuda_visible_devices",
        ]

    def _live(self, obj):
        return [a for a in obj.allocations.all() if a.live or obj.state not in Booking.LIVE_STATES]

    def get_devices(self, obj) -> list[dict]:
        return AllocationOutput(self._live(obj), many=True).data

    def get_cuda_visible_devices(self, obj) -> str:
        return ",".join(a.device_uuid for a in self._live(obj))

    def get_session(self, obj) -> SessionOutput(allow_null=True):
        return session_view(obj)

    def to_representation(self, obj):
        live = self._live(obj)
        tz = timezone.get_current_timezone()
        return {
            "id": obj.id,
            "owner": obj.owner.username,
            "project": obj.project.slug,
            "state": obj.state,
            "state_detail": obj.state_detail,
            "gpus": obj.gpus,
            "mig_profile": obj.mig_profile,
            "gpu_model": obj.gpu_model,
            "start": iso(obj.start, tz),
            "end": iso(obj.end, tz),
            "duration_s": obj.duration_s,
            "qos": obj.qos,
            "preemptible": obj.preemptible,
            "command": obj.command,
            "submitted_at": iso(obj.submitted_at, tz),
            "started_at": iso(obj.started_at, tz),
            "ended_at": iso(obj.ended_at, tz),
            "planned_start": iso(obj.planned_start, tz),
            "queue_position": obj.queue_position,
            "pending_reason": obj.pending_reason,
            "priority": obj.priority,
            "exit_code": obj.exit_code,
            "log_tail": obj.log_tail,
            "interactive": obj.interactive,
            "session": session_view(obj),
            "devices": [allocation_row(a, tz) for a in live],
            "cuda_visible_devices": ",".join(a.device_uuid for a in live),
        }


class NodeOutput(serializers.ModelSerializer):
    gpu_count = serializers.IntegerField(read_only=True)

    class Meta:
        model = Node
        fields = [
            "id",
            "hostname",
            "state",
            "state_reason",
            "last_seen",
            "agent_version",
            "gpu_count",
        ]


# What a sample stores, plus the energy counter that only the latest reading carries.
READING_FIELDS = (*SAMPLE_VALUES, "energy_mj")


class ReadingOutput(serializers.Serializer):
    """A device's latest reading (kept 5 minutes); null where NVML gives no value."""

    time = serializers.DateTimeField()
    utilization_gpu = serializers.FloatField(allow_null=True, help_text="%")
    utilization_memory = serializers.FloatField(allow_null=True, help_text="%")
    memory_used_mib = serializers.IntegerField(allow_null=True)
    memory_total_mib = serializers.IntegerField(allow_null=True)
    temperature_c = serializers.FloatField(allow_null=True)
    power_w = serializers.FloatField(allow_null=True)
    energy_mj = serializers.IntegerField(allow_null=True, help_text="since the driver loaded")
    processes = serializers.IntegerField(help_text="processes on the device")


def reading_json(reading: dict | None) -> dict | None:
    """ReadingOutput's JSON from a cached reading (agents.protocol's JSON plus node and time)."""
    if not reading:
        return None
    out = {"time": reading.get("time")}
    out.update({name: reading.get(name) for name in READING_FIELDS})
    out["processes"] = len(reading.get("processes") or ())
    return out


class MigInstanceOutput(serializers.ModelSerializer):
    gpu = serializers.CharField(source="gpu.uuid")
    node = serializers.CharField(source="gpu.node.hostname")
    model = serializers.CharField(source="gpu.model")
    reading = serializers.SerializerMethodField()

    class Meta:
        model = MigInstance
        fields = [
            "id",
            "uuid",
            "profile",
            "slices",
            "memory_mib",
            "gpu",
            "node",
            "model",
            "reading",
        ]

    def get_reading(self, obj) -> ReadingOutput(allow_null=True):
        return reading_json(self.context.get("readings", {}).get(obj.uuid))


class HistoryQuery(StrictSerializer):
    """?from=&to=&resolution=&max_points= of a history endpoint."""

    from_ = serializers.DateTimeField(required=False, help_text="default: 1 hour before `to`")
    to = serializers.DateTimeField(required=False, help_text="default: now")
    resolution = serializers.ChoiceField(
        choices=["auto", "raw", "minute"],
        default="auto",
        help_text="raw samples (kept TELEMETRY_RAW_RETENTION_H), minute averages, or auto: raw "
        "when the range lies within raw retention",
    )
    max_points = serializers.IntegerField(min_value=1, max_value=10000, default=1500)

    def get_fields(self):
        fields = super().get_fields()
        fields["from"] = fields.pop("from_")  # `from` is a keyword in Python
        return fields

    def validate(self, data):
        data = dict(data)
        until = data.get("to") or timezone.now()
        since = data.pop("from", None) or until - timedelta(hours=1)
        if since >= until:
            raise serializers.ValidationError({"from": ["Must be before `to`."]})
        return {**data, "since": since, "until": until}


class HistoryPointOutput(serializers.Serializer):
    time = serializers.DateTimeField()
    utilization_gpu = serializers.FloatField(allow_null=True)
    utilization_memory = serializers.FloatField(allow_null=True)
    memory_used_mib = serializers.FloatField(allow_null=True)
    memory_total_mib = serializers.FloatField(allow_null=True)
    temperature_c = serializers.FloatField(allow_null=True)
    power_w = serializers.FloatField(allow_null=True)


class DeviceHistoryOutput(serializers.Serializer):
    uuid = serializers.CharField()
    device = serializers.CharField()
    resolution = serializers.ChoiceField(choices=["raw", "minute"])
    points = HistoryPointOutput(many=True)


class BookingHistoryOutput(serializers.Serializer):
    booking = serializers.IntegerField()
    resolution = serializers.ChoiceField(choices=["raw", "minute"])
    devices = DeviceHistoryOutput(many=True)


class GpuOutput(serializers.ModelSerializer):
    node = serializers.CharField(source="node.hostname")
    mig_instances = serializers.SerializerMethodField()
    reading = serializers.SerializerMethodField()

    class Meta:
        model = Gpu
        fields = [
            "id",
            "uuid",
            "node",
            "index",
            "model",
            "memory_mib",
            "mig_mode",
            "mig_instances",
            "reading",
        ]

    def get_mig_instances(self, obj) -> list[dict]:
        return [{"id": m.id, "uuid": m.uuid, "profile": m.profile} for m in obj.mig_instances.all()]

    def get_reading(self, obj) -> ReadingOutput(allow_null=True):
        return reading_json(self.context.get("readings", {}).get(obj.uuid))

    def to_representation(self, obj):
        return {
            "id": obj.id,
            "uuid": obj.uuid,
            "node": obj.node.hostname,
            "index": obj.index,
            "model": obj.model,
            "memory_mib": obj.memory_mib,
            "mig_mode": obj.mig_mode,
            "mig_instances": self.get_mig_instances(obj),
            "reading": self.get_reading(obj),
        }


class QuotaLimitOutput(serializers.Serializer):
    project = serializers.CharField()
    role = serializers.CharField()
    limits = serializers.DictField()
    usage = serializers.DictField()
    project_usage = serializers.DictField()


class EstimateOutput(serializers.Serializer):
    earliest_start = serializers.DateTimeField(allow_null=True)
    reason = serializers.CharField(
        help_text="fits, starting, priority, resources, reservation, quota, ..."
    )
    detail = serializers.CharField()
    queue_position = serializers.IntegerField(allow_null=True)


class AccountingQuery(StrictSerializer):
    """?group_by=&from=&to= of the accounting report (`format` picks JSON or CSV)."""

    group_by = serializers.ChoiceField(choices=["project", "user", "model", "booking"])
    from_ = serializers.DateTimeField(help_text="start of the period (ISO 8601)")
    to = serializers.DateTimeField(required=False, help_text="end of the period; default now")
    format = serializers.ChoiceField(choices=["json", "csv"], required=False)

    def get_fields(self):
        fields = super().get_fields()
        fields["from"] = fields.pop("from_")
        return fields

    def validate(self, data):
        data = dict(data)
        data["since"] = data.pop("from")
        data["until"] = data.get("to") or timezone.now()
        if data["since"] >= data["until"]:
            raise serializers.ValidationError({"from": ["Must be before `to`."]})
        if data["until"] - data["since"] > timedelta(days=366):
            raise serializers.ValidationError({"to": ["A period is at most 366 days."]})
        return data


class AccountingRowOutput(serializers.Serializer):
    key = serializers.CharField(help_text="named after group_by: project, user, model or booking")
    bookings = serializers.IntegerField()
    gpu_hours = serializers.FloatField()
    energy_kwh = serializers.FloatField()
    mean_utilization = serializers.FloatField(allow_null=True, help_text="%, whole GPUs only")
    peak_memory_mib = serializers.IntegerField(allow_null=True)
