"""Input and output serializers. Inputs reject unknown fields; outputs are plain views of models.

List endpoints render dozens of rows a request, and DRF's generic field-by-field rendering was most
of their cost; so the output serializers declare their fields (for validation of the shape and the
OpenAPI schema) and render with a plain function, checked to match the generic rendering.
"""

from datetime import timedelta

from django.utils import timezone
from drf_spectacular.utils import OpenApiResponse, extend_schema_field
from rest_framework import serializers

from agents.protocol import output_file_name
from portal.models import (
    ApiToken,
    Booking,
    BookingDependency,
    Gpu,
    MigInstance,
    Node,
    NodeRun,
    Qos,
)
from portal.services.booking import booking_bounds, fairshare
from portal.services.booking.selectors import array_view, dependencies_by_booking, session_view
from portal.services.fleet.telemetry import SAMPLE_VALUES
from portal.services.inventory.resources import held_by_booking

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


class ErrorDetailOutput(serializers.Serializer):
    code = serializers.CharField(
        help_text="invalid, not_found, no_capacity, quota, invalid_state, "
        "idempotency_key_reused, throttled, busy, ..."
    )
    message = serializers.CharField()
    fields = serializers.DictField(
        child=serializers.CharField(), help_text="the fields (or header) at fault, and why"
    )
    limit = serializers.CharField(
        required=False, help_text="quota: max_gpus, gpu_hours_budget or max_duration_s"
    )
    limit_value = serializers.FloatField(required=False, help_text="quota: the limit's value")
    usage = serializers.FloatField(required=False, help_text="quota: what is in use already")
    asks = serializers.FloatField(required=False, help_text="quota: what the request asks")


class ErrorOutput(serializers.Serializer):
    """The one error shape of the API."""

    error = ErrorDetailOutput()


_ERRORS = {
    400: "bad input: `fields` names each field at fault",
    401: "`not_authenticated` or `token_expired`",
    403: "`forbidden`, or `token_read_only` for a read-only token",
    404: "not found among yours",
    409: "conflict: `no_capacity`, `quota` (with limit, limit_value, usage or asks) or "
    "`invalid_state`",
    422: "`idempotency_key_reused`: the Idempotency-Key was used with another request",
    429: "`throttled`: too many requests; retry after Retry-After seconds",
    503: "`busy`: retry after Retry-After seconds",
}


def error_responses(*statuses: int) -> dict:
    """OpenAPI responses in the one error shape, for extend_schema(responses=...)."""
    return {code: OpenApiResponse(ErrorOutput, _ERRORS[code]) for code in statuses}


class TokenNewInput(StrictSerializer):
    name = serializers.CharField(max_length=100, required=False, allow_blank=True)
    scope = serializers.ChoiceField(
        choices=ApiToken.Scope.choices, required=False, default=ApiToken.Scope.READ_WRITE
    )
    expires_at = serializers.DateTimeField(
        required=False, allow_null=True, default=None, help_text="Empty: never expires."
    )


class TokenCreateInput(TokenNewInput):
    username = serializers.CharField(max_length=150)
    password = serializers.CharField(max_length=256, style={"input_type": "password"})


class TokenCreatedOutput(serializers.Serializer):
    token = serializers.CharField(help_text="Shown once: store it now.")
    id = serializers.IntegerField()
    name = serializers.CharField()
    scope = serializers.CharField()
    expires_at = serializers.DateTimeField(allow_null=True)


class TokenOutput(serializers.ModelSerializer):
    class Meta:
        model = ApiToken
        fields = ["id", "name", "prefix", "scope", "created", "expires_at", "last_used"]


@extend_schema_field(
    {"oneOf": [{"type": "integer", "minimum": 1}, {"type": "string", "example": "64G"}]}
)
class MemorySizeField(serializers.Field):
    """MiB as a whole number, or a size with a unit ("64G"): passed on as given, parsed with
    the rest of the request (booking_rules._check_host) so every path refuses the same."""

    default_error_messages = {"invalid": "must be MiB or a size such as 64G."}

    def to_internal_value(self, data):
        if isinstance(data, bool) or not isinstance(data, (int, str)):
            self.fail("invalid")
        return data

    def to_representation(self, value):
        return value


class BookingCreateInput(StrictSerializer):
    """A booking request; its bounds are booking_bounds.request_bounds(), read per request."""

    project = serializers.SlugField(
        required=False, allow_blank=False, max_length=booking_bounds.PROJECT_MAX
    )
    gpus = serializers.IntegerField(required=False)
    mig_profile = serializers.CharField(required=False, max_length=booking_bounds.PROFILE_MAX)
    gpu_model = serializers.CharField(required=False, max_length=booking_bounds.MODEL_MAX)
    mixed_models = serializers.BooleanField(
        required=False,
        default=False,
        help_text="Any GPU models will do. Without it, a booking of 2 or more GPUs (on one node "
        "or on several) that names no gpu_model gets GPUs of one model. Not with gpu_model.",
    )
    gpu_fraction = serializers.FloatField(
        required=False,
        help_text="A fraction of one shared GPU's compute, 0 < f < 1 (docs/scheduling.md, "
        "Shared GPUs); gpus is then 1 or left out.",
    )
    gpu_memory_mib = serializers.IntegerField(
        required=False,
        help_text="The GPU memory (MiB) it needs on one shared GPU; alone, its share is that "
        "part of the GPU's memory.",
    )
    cpus = serializers.IntegerField(
        required=False,
        min_value=1,
        help_text="CPU cores per node (default: the site's per GPU, docs/scheduling.md "
        "Cores and memory).",
    )
    memory_mib = MemorySizeField(
        required=False,
        help_text='Host memory per node: MiB, or a size with a unit ("64G", "512M", "1T"; '
        "units of 1024). Default: the site's per GPU.",
    )
    start = serializers.DateTimeField(required=False)
    end = serializers.DateTimeField(required=False)
    duration_s = serializers.IntegerField(required=False)
    qos = serializers.ChoiceField(choices=Qos.choices, required=False, default=Qos.NORMAL)
    preemptible = serializers.BooleanField(required=False, default=False)
    command = serializers.CharField(
        required=False,
        allow_blank=True,
        max_length=booking_bounds.COMMAND_MAX,
        trim_whitespace=False,
    )
    interactive = serializers.ChoiceField(
        choices=Booking.Interactive.choices,
        required=False,
        help_text="Run JupyterLab or a terminal on the booked devices, opened through the portal.",
    )
    workdir = serializers.CharField(
        required=False,
        allow_blank=True,
        trim_whitespace=False,
        help_text="The batch job's working directory, an absolute path on the nodes (default: "
        "the owner's home); its output goes to gpu-portal-<id>.out there.",
    )
    env = serializers.DictField(
        child=serializers.CharField(allow_blank=True, trim_whitespace=False),
        required=False,
        help_text=f"Environment variables for the command, NAME: value (at most "
        f"{booking_bounds.ENV_VARS_MAX}; the launch variables the portal sets cannot be set).",
    )
    node_count = serializers.IntegerField(
        required=False,
        min_value=1,
        max_value=1024,
        help_text="Run on this many whole nodes, one process each (docs/distributed.md); gpus "
        "is then the nodes' GPUs, worked out when all nodes are one size.",
    )
    signal = serializers.CharField(
        required=False,
        allow_blank=True,
        max_length=32,
        help_text="A signal before the end or an early stop, Slurm's --signal: NAME[@SECONDS], "
        "e.g. USR1@120 (default: the site's JOB_SIGNAL_DEFAULT); the seconds are fewer than the "
        "booking's.",
    )
    image = serializers.CharField(
        required=False,
        max_length=500,
        help_text="Run the command in this container image (docker://..., a .sif path, "
        "oras://...), from a source the site allows (CONTAINER_IMAGE_SOURCES).",
    )
    array = serializers.CharField(
        required=False,
        max_length=200,
        help_text="A job array: task ids and an optional running limit, e.g. 0-99%10. One "
        "booking per task (each with GPU_PORTAL_ARRAY_TASK_ID); the response is the first task.",
    )
    after = serializers.CharField(
        required=False,
        max_length=2000,
        help_text="Start only after other bookings end: afterok:41 (finished), afternotok:41 "
        "(ended any other way), afterany:41; several as afterok:41:42,afterany:43.",
    )

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # The settings' bounds, as they are now (a field's validators are fixed when it is made).
        bounds = booking_bounds.request_bounds()
        self.fields["gpus"] = serializers.IntegerField(
            required=False, min_value=bounds.gpus_min, max_value=bounds.gpus_max
        )
        self.fields["duration_s"] = serializers.IntegerField(
            required=False, min_value=bounds.duration_min_s, max_value=bounds.duration_max_s
        )


class BookingExtendInput(StrictSerializer):
    by_s = serializers.IntegerField(min_value=60, max_value=MAX_SECONDS)


class ArrayCancelOutput(serializers.Serializer):
    array = serializers.IntegerField(source="array_id", help_text="the array: its first task's id")
    cancelled = serializers.ListField(
        child=serializers.IntegerField(), help_text="the tasks this call cancelled"
    )
    states = serializers.DictField(
        child=serializers.IntegerField(), help_text="the array's tasks by state, after"
    )


def gpus_shown(gpus: int, mig_profile: str) -> int | None:
    """A booking's `gpus` in the API: whole GPUs, or null for a MIG slice (not 0 GPUs)."""
    return None if mig_profile else gpus


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
        "model": allocation.gpu.model,
        "start": iso(allocation.start, tz),
        "end": iso(allocation.end, tz),
        "share": allocation.share,
        "gpu_memory_mib": allocation.gpu_memory_mib,
    }


def allocation_shown(*, live: bool, start, state: str, requeued_at) -> bool:
    """Whether a booking shows this allocation: while the booking is live, its live ones; once
    it ended, all of its last run's (those before a requeue were an earlier run's)."""
    return (live or state not in Booking.LIVE_STATES) and (
        requeued_at is None or start >= requeued_at
    )


def booking_window(booking_start, booking_end, held: list[tuple]) -> tuple:
    """A booking's (start, end): a reservation's window, else its devices' span (start, end
    pairs of the allocations it shows): None until an ASAP booking has devices."""
    if booking_start is not None or not held:
        return booking_start, booking_end
    return min(start for start, _ in held), max(end for _, end in held)


class AllocationOutput(serializers.Serializer):
    device = serializers.CharField(source="device_label")
    uuid = serializers.CharField(source="device_uuid")
    node = serializers.CharField(source="gpu.node.hostname")
    model = serializers.CharField(source="gpu.model")
    start = serializers.DateTimeField()
    end = serializers.DateTimeField()
    share = serializers.FloatField(help_text="Compute share of its GPU: 1, or a fraction.")
    gpu_memory_mib = serializers.IntegerField(
        allow_null=True, help_text="GPU memory a fraction holds (MiB); null: the whole device."
    )


class HeldOutput(serializers.Serializer):
    """The cores and host memory a running booking holds on one node (resources.node_demand)."""

    node = serializers.CharField()
    cpus = serializers.IntegerField()
    memory_mib = serializers.IntegerField()


class SessionOutput(serializers.Serializer):
    """An interactive booking's session: state, a sentence, and the portal URL once running."""

    label = serializers.CharField()
    state = serializers.CharField()
    detail = serializers.CharField()
    url = serializers.CharField()


class NodeRunOutput(serializers.Serializer):
    node = serializers.CharField()
    rank = serializers.IntegerField()
    state = serializers.ChoiceField(choices=NodeRun.State.choices)
    exit_code = serializers.IntegerField(allow_null=True)
    log_tail = serializers.CharField()
    detail = serializers.CharField()


def node_runs_shown():
    """The per-node runs a booking's API rows show (prefetched with the booking)."""
    return NodeRun.objects.select_related("node").order_by("restart", "rank", "id")


NODE_RUN_FIELDS = ("node__hostname", "rank", "state", "exit_code", "log_tail", "detail")


def node_run_rows(booking) -> list[dict]:
    """Each node's process of the booking's current run (the prefetched node_runs)."""
    return [
        node_run_row({f: getattr(run, f) for f in NODE_RUN_FIELDS[1:]}, run.node.hostname)
        for run in booking.node_runs.all()
        if run.restart == booking.restart_count
    ]


def node_run_row(values: dict, hostname: str) -> dict:
    return {"node": hostname, **{f: values[f] for f in NODE_RUN_FIELDS[1:]}}


def booking_signal(signal_name: str, signal_before_s: int | None) -> str:
    return f"{signal_name}@{signal_before_s}" if signal_name else ""


def booking_output_file(booking_id: int, command: str) -> str:
    return output_file_name(booking_id) if command else ""


class ArrayOutput(serializers.Serializer):
    job_id = serializers.IntegerField(help_text="the array's first task, which names the array")
    task_id = serializers.IntegerField()
    spec = serializers.CharField()


class DependencyOutput(serializers.Serializer):
    kind = serializers.ChoiceField(choices=BookingDependency.Kind.choices)
    booking = serializers.IntegerField()


def _array(obj) -> dict | None:
    return array_view(parent_id=obj.array_parent_id, task_id=obj.array_task_id, spec=obj.array_spec)


class BookingOutput(serializers.ModelSerializer):
    owner = serializers.CharField(source="owner.username")
    project = serializers.CharField(source="project.slug")
    start = serializers.SerializerMethodField(
        help_text="a reservation's window start, else when its devices were given; null before"
    )
    end = serializers.SerializerMethodField(
        help_text="a reservation's window end, else its devices' end (the real end once ended)"
    )
    gpus = serializers.IntegerField(
        allow_null=True, help_text="whole GPUs; null for a MIG slice (see mig_profile)"
    )
    devices = serializers.SerializerMethodField()
    held = serializers.SerializerMethodField(
        help_text="While it holds devices: the cores and host memory it holds on each node "
        "(asked, else the site's default): [{node, cpus, memory_mib}]."
    )
    cuda_visible_devices = serializers.SerializerMethodField()
    priority = serializers.SerializerMethodField(
        help_text="Priority factors (age, fairshare, size, qos, total) and `fairshare_charge`: "
        "what fair share charges (allocated, measured or blend; SCHEDULER_FAIRSHARE_CHARGE)."
    )
    session = serializers.SerializerMethodField()
    signal = serializers.SerializerMethodField(help_text="NAME@SECONDS, or blank: the site's")
    output_file = serializers.SerializerMethodField(
        help_text="the batch job's stdout+stderr file in its working directory, on each node"
    )
    nodes = serializers.SerializerMethodField(
        help_text="each node's process of the current run, rank order: node, rank, state, "
        "exit_code, log_tail (its last 4 KiB), detail"
    )
    array = serializers.SerializerMethodField(
        help_text="An array task's array (job_id: its first task), task_id and spec; else null."
    )
    dependencies = serializers.SerializerMethodField(
        help_text="Bookings this one starts after: [{kind, booking}]."
    )

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
            "mixed_models",
            "gpu_fraction",
            "gpu_memory_mib",
            "cpus",
            "memory_mib",
            "held",
            "start",
            "end",
            "duration_s",
            "qos",
            "preemptible",
            "borrowed",
            "borrowed_past",
            "command",
            "image",
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
            "workdir",
            "env",
            "signal",
            "output_file",
            "restart_count",
            "nodes",
            "array",
            "dependencies",
            "devices",
            "cuda_visible_devices",
        ]

    def _live(self, obj):
        return [
            a
            for a in obj.allocations.all()
            if allocation_shown(
                live=a.live, start=a.start, state=obj.state, requeued_at=obj.requeued_at
            )
        ]

    def _window(self, obj) -> tuple:
        return booking_window(obj.start, obj.end, [(a.start, a.end) for a in self._live(obj)])

    def get_start(self, obj) -> serializers.DateTimeField(allow_null=True):
        return iso(self._window(obj)[0])

    def get_end(self, obj) -> serializers.DateTimeField(allow_null=True):
        return iso(self._window(obj)[1])

    def get_devices(self, obj) -> list[dict]:
        return AllocationOutput(self._live(obj), many=True).data

    def get_held(self, obj) -> HeldOutput(many=True):
        return self._held(obj, self._live(obj))

    def _held(self, obj, shown) -> list[dict]:
        rows = [
            (
                obj.pk,
                a.gpu.node_id,
                a.gpu.node.hostname,
                a.fraction,
                obj.cpus,
                obj.memory_mib,
                a.gpu.node.cpus is not None,
            )
            for a in shown
            if a.live
        ]
        return held_by_booking(rows).get(obj.pk, [])

    def get_priority(self, obj) -> dict | None:
        return fairshare.priority_breakdown(obj.priority)

    def get_cuda_visible_devices(self, obj) -> str:
        return ",".join(a.device_uuid for a in self._live(obj))

    def get_session(self, obj) -> SessionOutput(allow_null=True):
        return session_view(obj)

    def get_signal(self, obj) -> str:
        return booking_signal(obj.signal_name, obj.signal_before_s)

    def get_output_file(self, obj) -> str:
        return booking_output_file(obj.pk, obj.command)

    def get_nodes(self, obj) -> NodeRunOutput(many=True):
        return node_run_rows(obj)

    def get_array(self, obj) -> ArrayOutput(allow_null=True):
        return _array(obj)

    def get_dependencies(self, obj) -> DependencyOutput(many=True):
        return dependencies_by_booking([obj.pk]).get(obj.pk, [])

    def to_representation(self, obj):
        live = self._live(obj)
        tz = timezone.get_current_timezone()
        start, end = self._window(obj)
        return {
            "id": obj.id,
            "owner": obj.owner.username,
            "project": obj.project.slug,
            "state": obj.state,
            "state_detail": obj.state_detail,
            "gpus": gpus_shown(obj.gpus, obj.mig_profile),
            "mig_profile": obj.mig_profile,
            "gpu_model": obj.gpu_model,
            "mixed_models": obj.mixed_models,
            "gpu_fraction": obj.gpu_fraction,
            "gpu_memory_mib": obj.gpu_memory_mib,
            "cpus": obj.cpus,
            "memory_mib": obj.memory_mib,
            "held": self._held(obj, live),
            "start": iso(start, tz),
            "end": iso(end, tz),
            "duration_s": obj.duration_s,
            "qos": obj.qos,
            "preemptible": obj.preemptible or obj.borrowed,
            "borrowed": obj.borrowed,
            "borrowed_past": obj.borrowed_past,
            "command": obj.command,
            "image": obj.image,
            "submitted_at": iso(obj.submitted_at, tz),
            "started_at": iso(obj.started_at, tz),
            "ended_at": iso(obj.ended_at, tz),
            "planned_start": iso(obj.planned_start, tz),
            "queue_position": obj.queue_position,
            "pending_reason": obj.pending_reason,
            "priority": fairshare.priority_breakdown(obj.priority),
            "exit_code": obj.exit_code,
            "log_tail": obj.log_tail,
            "interactive": obj.interactive,
            "session": session_view(obj),
            "workdir": obj.workdir,
            "env": obj.env,
            "signal": booking_signal(obj.signal_name, obj.signal_before_s),
            "output_file": booking_output_file(obj.pk, obj.command),
            "restart_count": obj.restart_count,
            "nodes": node_run_rows(obj),
            "array": _array(obj),
            "dependencies": dependencies_by_booking([obj.pk]).get(obj.pk, []),
            "devices": [allocation_row(a, tz) for a in live],
            "cuda_visible_devices": ",".join(a.device_uuid for a in live),
        }


class NodeOutput(serializers.ModelSerializer):
    """A node; ``cpus_allocated`` / ``memory_mib_allocated`` (null where its agent reports no
    cores and memory) come from the view's context ``allocated``: {node id: (cores, MiB)}."""

    gpu_count = serializers.IntegerField(read_only=True)
    last_seen = serializers.DateTimeField(read_only=True, allow_null=True)
    cpus_allocated = serializers.SerializerMethodField(
        help_text="cores held now by running bookings (null: the node reports no cores)"
    )
    memory_mib_allocated = serializers.SerializerMethodField(
        help_text="host memory held now by running bookings, in MiB (null: none reported)"
    )

    def get_cpus_allocated(self, obj) -> int | None:
        held = self.context.get("allocated", {}).get(obj.pk)
        return None if held is None else held[0]

    def get_memory_mib_allocated(self, obj) -> int | None:
        held = self.context.get("allocated", {}).get(obj.pk)
        return None if held is None else held[1]

    class Meta:
        model = Node
        fields = [
            "id",
            "hostname",
            "state",
            "state_reason",
            "last_seen",
            "agent_version",
            "network_group",
            "gpu_count",
            "cpus",
            "memory_mib",
            "cpus_allocated",
            "memory_mib_allocated",
        ]
        read_only_fields = ["cpus", "memory_mib"]


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
    label = serializers.CharField(
        source="__str__", help_text="node/gpuN/profile@first slice, e.g. gpu-a03/gpu4/1g.10gb@5"
    )
    gpu = serializers.CharField(source="gpu.uuid")
    node = serializers.CharField(source="gpu.node.hostname")
    model = serializers.CharField(source="gpu.model")
    reading = serializers.SerializerMethodField()

    class Meta:
        model = MigInstance
        fields = [
            "id",
            "uuid",
            "label",
            "profile",
            "slices",
            "placement_start",
            "memory_mib",
            "gpu",
            "node",
            "model",
            "retired_at",
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
    # Its topology as its agent reported it: NVLink peers are GPU indexes on its node.
    nvlink_peers = serializers.ListField(child=serializers.IntegerField(), read_only=True)
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
            "sharing",
            "retired_at",
            "pci_bus_id",
            "numa_node",
            "nvlink_peers",
            "mig_instances",
            "reading",
        ]
        read_only_fields = fields

    def get_mig_instances(self, obj) -> list[dict]:
        # Its live instances (the present layout); retired ones are reachable by their own id.
        return [
            {"id": m.id, "uuid": m.uuid, "profile": m.profile}
            for m in obj.mig_instances.all()
            if m.retired_at is None
        ]

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
            "sharing": obj.sharing,
            "retired_at": iso(obj.retired_at),
            "pci_bus_id": obj.pci_bus_id,
            "numa_node": obj.numa_node,
            "nvlink_peers": obj.nvlink_peers,
            "mig_instances": self.get_mig_instances(obj),
            "reading": self.get_reading(obj),
        }


class SharingInput(StrictSerializer):
    """A GPU's (or a node's GPUs') sharing mode (docs/scheduling.md, Shared GPUs)."""

    sharing = serializers.ChoiceField(
        choices=Gpu.Sharing.choices,
        help_text="exclusive: whole (or MIG slices) to one booking; shared: fractions to several.",
    )


class SharingOutput(serializers.Serializer):
    node = serializers.CharField()
    sharing = serializers.CharField()
    changed = serializers.IntegerField(help_text="GPUs whose mode changed")


class QuotaLimitsOutput(serializers.Serializer):
    max_gpus = serializers.FloatField(allow_null=True, help_text="GPU-equivalents at once")
    gpu_hours_budget = serializers.FloatField(allow_null=True)
    budget_period_days = serializers.IntegerField()
    max_duration_s = serializers.IntegerField(allow_null=True)
    allowed_models = serializers.ListField(child=serializers.CharField())
    allowed_qos = serializers.ListField(child=serializers.CharField())
    fairshare_shares = serializers.FloatField()


class QuotaUsageOutput(serializers.Serializer):
    gpus_in_use = serializers.FloatField()
    gpu_hours_used = serializers.FloatField(help_text="in the rolling budget period")


class QuotaLimitOutput(serializers.Serializer):
    project = serializers.CharField()
    role = serializers.CharField()
    limits = QuotaLimitsOutput()
    usage = QuotaUsageOutput(help_text="mine")
    project_usage = QuotaUsageOutput(help_text="the whole project's")


class MyQuotaOutput(serializers.Serializer):
    results = QuotaLimitOutput(many=True, help_text="one per project, by project slug")


class WindowOutput(serializers.Serializer):
    start = serializers.DateTimeField()
    end = serializers.DateTimeField()


class EstimateOutput(serializers.Serializer):
    """Named as on a booking: what its planned_start, queue_position, pending_reason and
    state_detail would be if it were submitted now."""

    planned_start = serializers.DateTimeField(
        allow_null=True, help_text="the earliest start; null if none can be found"
    )
    queue_position = serializers.IntegerField(
        allow_null=True, help_text="null when it would start at once, or for a reservation"
    )
    pending_reason = serializers.CharField(
        help_text="fits (a reservation), starting (at once), priority, resources, reservation, "
        "quota, node_down, never, or a refusal's error code"
    )
    state_detail = serializers.CharField(help_text="a sentence: why not sooner")
    next_window = WindowOutput(
        allow_null=True,
        help_text="for a reservation window that does not fit: the next window of the same "
        "length that does, {start, end}, within 30 days of the asked start; else null",
    )


class FromToQuery(StrictSerializer):
    """A query with a `from` parameter (a Python keyword, so declared as `from_`)."""

    def get_fields(self):
        fields = super().get_fields()
        fields["from"] = fields.pop("from_")
        return fields


class AccountingQuery(FromToQuery):
    """?group_by=&from=&to= of the accounting report (`format` picks JSON or CSV)."""

    group_by = serializers.ChoiceField(choices=["project", "user", "model", "booking"])
    from_ = serializers.DateTimeField(help_text="start of the period (ISO 8601)")
    to = serializers.DateTimeField(required=False, help_text="end of the period; default now")
    format = serializers.ChoiceField(choices=["json", "csv"], required=False)

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
    reserved_unused_gpu_hours = serializers.FloatField(
        required=False,
        help_text="group_by=project only: GPU-hours its project reservations set aside unused",
    )


class AuditQuery(FromToQuery):
    """Filters of the audit log (`format` picks JSON pages or a CSV of every match)."""

    action = serializers.CharField(
        required=False, max_length=40, help_text='e.g. "booking.cancel", or "booking." for all'
    )
    actor = serializers.CharField(required=False, max_length=150, help_text="username")
    project = serializers.SlugField(required=False, max_length=64)
    target_type = serializers.CharField(required=False, max_length=40)
    target_id = serializers.CharField(required=False, max_length=64)
    from_ = serializers.DateTimeField(required=False)
    to = serializers.DateTimeField(required=False)
    format = serializers.ChoiceField(choices=["json", "csv"], required=False)
    page = serializers.IntegerField(required=False, min_value=1)
    page_size = serializers.IntegerField(required=False, min_value=1)

    def validate(self, data):
        data = dict(data)
        data["since"], data["until"] = data.pop("from", None), data.pop("to", None)
        if data["since"] and data["until"] and data["since"] >= data["until"]:
            raise serializers.ValidationError({"from": ["Must be before `to`."]})
        return data


class AuditEventOutput(serializers.Serializer):
    id = serializers.IntegerField()
    at = serializers.DateTimeField()
    actor = serializers.CharField(help_text="username at the time ('' for the system)")
    address = serializers.CharField()
    via = serializers.ChoiceField(choices=["web", "api", "admin", "system"])
    action = serializers.CharField()
    target_type = serializers.CharField()
    target_id = serializers.CharField()
    project = serializers.CharField()
    before = serializers.JSONField(allow_null=True)
    after = serializers.JSONField(allow_null=True)
