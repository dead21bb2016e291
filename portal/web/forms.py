"""Forms of the pages. They parse input; the booking rules live in the services."""

from django import forms
from django.contrib.admin.forms import AdminAuthenticationForm
from django.contrib.auth.forms import AuthenticationForm
from django.core import validators

from portal.errors import ApplicationError
from portal.models import Booking, Qos
from portal.services.access import login_throttle
from portal.services.booking import booking_bounds
from portal.services.inventory import selectors as inventory

# Times are typed as UTC in 24-hour form; a browser's datetime-local picker would show the
# viewer's locale (12-hour with AM/PM in many) on pages that say UTC. The T form is what links
# from the calendar carry.
DATETIME_UTC = "%Y-%m-%d %H:%M"
DATETIME_INPUTS = [DATETIME_UTC, "%Y-%m-%dT%H:%M"]
# Service field names that the form shows under another name.
SERVICE_TO_FORM_FIELD = {
    "duration_s": "duration_hours",
    "by_s": "by_hours",
    "gpu_memory_mib": "gpu_memory_gib",
}


class ThrottledLoginMixin:
    """Refuses a login, without checking the password, after too many failures from the client's
    address or for the username; counts each failure. `throttled_s` says the view should 429."""

    throttled_s = 0

    def clean(self):
        username = self.cleaned_data.get("username") or ""
        wait = login_throttle.wait_s(self.request, username)
        if wait:
            self.throttled_s = wait
            raise forms.ValidationError(login_throttle.message(wait), code="throttled")
        try:
            return super().clean()
        except forms.ValidationError:
            login_throttle.record_failure(self.request, username)
            raise


class ThrottledAuthenticationForm(ThrottledLoginMixin, AuthenticationForm):
    pass


class ThrottledAdminAuthenticationForm(ThrottledLoginMixin, AdminAuthenticationForm):
    pass


class UtcDateTimeInput(forms.DateTimeInput):
    """A text box for 'YYYY-MM-DD HH:MM' (UTC, 24-hour), the same in every browser and locale."""

    input_type = "text"

    def __init__(self, **kwargs):
        attrs = {
            "placeholder": "YYYY-MM-DD HH:MM",
            "pattern": r"\d{4}-\d{2}-\d{2}[ T]\d{2}:\d{2}",
            "inputmode": "numeric",
            "autocomplete": "off",
            "size": 16,
        }
        super().__init__(format=DATETIME_UTC, attrs=attrs, **kwargs)


class AccessibleForm(forms.Form):
    """Points each field with an error at its error text, for screen readers."""

    def add_error(self, field, error):
        super().add_error(field, error)
        names = [field] if field else []
        if isinstance(error, dict):
            names = list(error)
        for name in names:
            if name in self.fields:
                widget = self.fields[name].widget
                auto_id = self[name].auto_id
                described = f"{auto_id}_error"
                if self.fields[name].help_text:
                    described += f" {auto_id}_helptext"
                widget.attrs["aria-describedby"] = described


# One message for every way the field can be wrong (empty, not a number, below 1).
GPUS_AT_LEAST_ONE = "Number of GPUs: give a whole number, at least 1."


class BookForm(AccessibleForm):
    """Book whole GPUs, one MIG slice or a fraction of a shared GPU (where the site shares
    one), as soon as possible or for a fixed window."""

    project = forms.ChoiceField()
    kind = forms.ChoiceField(
        choices=[("gpus", "Whole GPUs"), ("mig", "A MIG slice")],
        widget=forms.RadioSelect,
        initial="gpus",
        label="What",
    )
    gpus = forms.IntegerField(
        min_value=1,
        initial=1,
        required=False,
        label="Number of GPUs",
        error_messages={"min_value": GPUS_AT_LEAST_ONE, "invalid": GPUS_AT_LEAST_ONE},
    )
    mig_profile = forms.ChoiceField(required=False, label="MIG profile")
    gpu_fraction = forms.FloatField(
        required=False,
        label="Share of the GPU",
        help_text="Of its compute, e.g. 0.25; or give only the memory.",
    )
    gpu_memory_gib = forms.FloatField(
        required=False,
        min_value=0.001,
        label="GPU memory (GiB)",
        help_text="What it needs; alone, its share is that part of the GPU's memory.",
    )
    cpus = forms.IntegerField(
        required=False,
        min_value=1,
        label="CPU cores per node",
        help_text="Empty: the site's default for the GPUs booked.",
    )
    # A size with a unit (64G, 512M, 1T) or MiB, parsed by the booking service as the API's.
    memory_mib = forms.CharField(
        required=False,
        max_length=20,
        label="Host memory per node",
        help_text="e.g. 64G or 512M; empty: the site's default for the GPUs booked.",
    )
    gpu_model = forms.ChoiceField(required=False, label="GPU model")
    mixed_models = forms.BooleanField(
        required=False,
        label="Any mix of models",
        help_text="2 or more GPUs with no model chosen are of one model; tick this if GPUs of "
        "different models will do.",
    )
    when = forms.ChoiceField(
        choices=[("asap", "As soon as possible"), ("window", "A fixed window")],
        widget=forms.RadioSelect,
        initial="asap",
        label="When",
    )
    duration_hours = forms.FloatField(
        min_value=0.02, initial=4, required=False, label="Duration (hours)"
    )
    start = forms.DateTimeField(
        required=False,
        widget=UtcDateTimeInput(),
        input_formats=DATETIME_INPUTS,
        label="Start (UTC)",
        help_text="24-hour, e.g. 2030-01-01 09:00",
    )
    end = forms.DateTimeField(
        required=False,
        widget=UtcDateTimeInput(),
        input_formats=DATETIME_INPUTS,
        label="End (UTC)",
        help_text="24-hour, e.g. 2030-01-01 17:00",
    )
    qos = forms.ChoiceField(choices=Qos.choices, initial=Qos.NORMAL, label="QOS")
    preemptible = forms.BooleanField(
        required=False,
        help_text="Lets higher-QOS work stop this booking early; it may start sooner.",
    )
    command = forms.CharField(
        required=False,
        widget=forms.Textarea(attrs={"rows": 3, "spellcheck": "false"}),
        help_text="Optional: run this as a batch job; leave empty for an interactive booking.",
    )
    interactive = forms.ChoiceField(
        choices=Booking.Interactive.choices,
        initial=Booking.Interactive.NONE,
        required=False,
        label="Interactive session",
        help_text="JupyterLab or a terminal on the booked devices, opened from the booking page.",
    )
    workdir = forms.CharField(
        required=False,
        max_length=booking_bounds.WORKDIR_MAX,
        label="Working directory",
        help_text="An absolute path on the nodes (default: your home); the job's output goes to "
        "gpu-portal-<id>.out there.",
    )
    env = forms.CharField(
        required=False,
        # The service's bounds, plus "=" and a line break a variable: read before it is split.
        max_length=booking_bounds.ENV_TOTAL_MAX + 3 * booking_bounds.ENV_VARS_MAX,
        widget=forms.Textarea(attrs={"rows": 2, "spellcheck": "false"}),
        label="Environment variables",
        help_text="NAME=value, one per line, for the command.",
    )
    signal = forms.CharField(
        required=False,
        max_length=32,
        label="Signal before the end",
        help_text="e.g. USR1@120: SIGUSR1 two minutes before the end or a preemption, to "
        "checkpoint (default: the site's).",
    )
    image = forms.CharField(
        required=False,
        max_length=500,
        label="Container image",
        help_text="Optional, with a command: run it in this image, e.g. "
        "docker://nvcr.io/nvidia/pytorch:24.05-py3 or /shared/images/torch.sif.",
    )
    array = forms.CharField(
        required=False,
        max_length=200,
        label="Job array",
        help_text="Optional, with a command: task ids and a running limit, e.g. 0-99%10 "
        "(each task gets GPU_PORTAL_ARRAY_TASK_ID).",
    )
    after = forms.CharField(
        required=False,
        max_length=2000,
        label="Start after",
        help_text="Optional: bookings that must end first, e.g. afterok:41 (finished), "
        "afternotok:41, afterany:41:42.",
    )

    def __init__(self, *args, projects: list[str], **kwargs):
        super().__init__(*args, **kwargs)
        self._bound(booking_bounds.request_bounds())
        self.fields["project"].choices = [(p, p) for p in projects]
        if len(projects) == 1:
            self.fields["project"].initial = projects[0]
        if inventory.shared_gpu_memory() is not None:  # only where some GPU is shared
            kinds = self.fields["kind"].choices + [("shared", "A fraction of a shared GPU")]
            self.fields["kind"].choices = kinds
        profiles = inventory.mig_profiles()
        self.fields["mig_profile"].choices = [("", "Choose a profile")] + [(p, p) for p in profiles]
        models = inventory.site_gpu_models()
        self.fields["gpu_model"].choices = [("", "Any one model")] + [(m, m) for m in models]

    def _bound(self, bounds: booking_bounds.RequestBounds) -> None:
        # The request bounds the API has too; built per form, so the settings as they are now.
        gpus = self.fields["gpus"]
        gpus.max_value = bounds.gpus_max
        gpus.validators.append(validators.MaxValueValidator(bounds.gpus_max))
        gpus.widget.attrs["max"] = bounds.gpus_max
        hours = self.fields["duration_hours"]
        hours.max_value = bounds.duration_max_s / 3600
        hours.validators.append(validators.MaxValueValidator(hours.max_value))
        hours.widget.attrs["max"] = hours.max_value
        command = self.fields["command"]
        command.max_length = bounds.command_max
        command.validators.append(validators.MaxLengthValidator(bounds.command_max))
        command.widget.attrs["maxlength"] = bounds.command_max

    def clean(self):
        data = super().clean()
        if data.get("kind") == "mig" and not data.get("mig_profile"):
            self.add_error("mig_profile", "Choose a MIG profile.")
        if data.get("kind") == "gpus" and not data.get("gpus") and "gpus" not in self.errors:
            self.add_error("gpus", GPUS_AT_LEAST_ONE)
        shared = ("gpu_fraction", "gpu_memory_gib")
        if data.get("kind") == "shared" and not any(data.get(n) for n in shared):
            if not any(n in self.errors for n in shared):
                self.add_error("gpu_fraction", "Give a share of the GPU or the memory it needs.")
        if data.get("when") == "asap" and not data.get("duration_hours"):
            self.add_error("duration_hours", "Give a duration in hours.")
        if data.get("when") == "window":
            for name in ("start", "end"):
                if not data.get(name) and name not in self.errors:
                    self.add_error(name, "Required for a fixed window.")
        data["env"] = self._env(data.get("env") or "")
        return data

    def _env(self, text: str) -> dict[str, str]:
        # NAME=value lines; the values' bounds are the service's (booking.job_env).
        env = {}
        for number, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            name, equals, value = line.partition("=")
            if not equals:
                self.add_error("env", f"Line {number}: write NAME=value.")
                return {}
            env[name.strip()] = value
        return env

    def submit_kwargs(self) -> dict:
        """The booking_submit arguments this form stands for."""
        data = self.cleaned_data
        kwargs = {
            "project": data["project"],
            "gpu_model": data.get("gpu_model") or None,
            "mixed_models": bool(data.get("mixed_models")),
            "qos": data["qos"],
            "preemptible": data["preemptible"],
            "command": data.get("command") or "",
            "interactive": data.get("interactive") or None,
            "workdir": data.get("workdir") or None,
            "env": data.get("env") or None,
            "signal": data.get("signal") or None,
            "image": data.get("image") or None,
            "array": data.get("array") or None,
            "after": data.get("after") or None,
            "cpus": data.get("cpus"),
            "memory_mib": (data.get("memory_mib") or "").strip() or None,
        }
        if data["kind"] == "mig":
            kwargs["mig_profile"] = data["mig_profile"]
        elif data["kind"] == "shared":
            kwargs["gpu_fraction"] = data.get("gpu_fraction")
            gib = data.get("gpu_memory_gib")
            kwargs["gpu_memory_mib"] = None if gib is None else round(gib * 1024)
            kwargs["mixed_models"] = False
        else:
            kwargs["gpus"] = data["gpus"]
        if data["when"] == "window":
            kwargs.update(start=data["start"], end=data["end"])
        else:
            kwargs["duration_s"] = round(data["duration_hours"] * 3600)
        return kwargs


class ExtendForm(AccessibleForm):
    by_hours = forms.TypedChoiceField(
        choices=[(1, "1 hour"), (4, "4 hours"), (24, "1 day")],
        coerce=int,
        initial=1,
        label="Extend by",
    )


def add_service_errors(form: forms.Form, error: ApplicationError) -> None:
    """Show a service refusal at the fields it names, else at the top of the form."""
    placed = False
    for name, reason in error.fields.items():
        field = SERVICE_TO_FORM_FIELD.get(name, name)
        head, _, part = field.partition(".")  # env.LR: the env field, about LR
        if head in form.fields:
            said = reason[:1].upper() + reason[1:]
            form.add_error(head, f"{part}: {said}" if part else said)
            placed = True
    if not placed:
        form.add_error(None, error.message)


class TokenForm(AccessibleForm):
    """A new API token: a name, read-only or read-write, and an optional lifetime."""

    name = forms.CharField(max_length=100, help_text="What it is for, e.g. “laptop” or “grafana”.")
    scope = forms.ChoiceField(
        choices=[("read-write", "Read and write"), ("read", "Read only")],
        widget=forms.RadioSelect,
        initial="read-write",
        label="Access",
    )
    expires_days = forms.IntegerField(
        min_value=1,
        max_value=3650,
        required=False,
        label="Expires after (days)",
        help_text="Empty: never expires.",
    )
