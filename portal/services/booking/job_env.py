"""A batch job's environment at submit: working directory, variables, signal, and how many
nodes (docs/distributed.md).

Checked before anything is written, each refusal a 400 naming the field; the bounds are
booking_bounds' (the agent protocol mirrors them). The variables only the agent sets
(agents.protocol.JOB_ENV_RESERVED: the launch variables, CUDA_VISIBLE_DEVICES, GPU_PORTAL_*,
and what container runtimes read to choose the devices, NVIDIA_VISIBLE_DEVICES, APPTAINERENV_*,
...) cannot be set.
"""

import re
from dataclasses import dataclass, field

from django.db.models import Count, Q

from agents.protocol import job_env_reserved
from portal.errors import ValidationFailed
from portal.job_env import signal_parse
from portal.models import Booking, Node
from portal.services.booking import booking_bounds as bounds
from portal.services.inventory import selectors as inventory

ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


@dataclass(frozen=True)
class JobEnv:
    """A validated job environment, as the booking stores it."""

    workdir: str = ""
    env: dict[str, str] = field(default_factory=dict)
    signal_name: str = ""
    signal_before_s: int | None = None


def job_env_check(
    *, command: str, workdir: str | None, env: dict | None, signal: str | None, duration_s: int
) -> JobEnv:
    """The job environment of a submission of `duration_s` seconds, or a 400 naming the field
    and the reason."""
    asked = {"workdir": workdir, "env": env, "signal": signal}
    if not command:
        for name, value in asked.items():
            if value:
                raise ValidationFailed.field(name, "applies to a batch job: give a command too.")
        return JobEnv()
    name, before = _signal(signal, duration_s)
    return JobEnv(
        workdir=_workdir(workdir), env=_env(env), signal_name=name, signal_before_s=before
    )


def job_env_apply(booking: Booking, job: JobEnv) -> None:
    """Set an unsaved booking's job environment."""
    booking.workdir, booking.env = job.workdir, dict(job.env)
    booking.signal_name, booking.signal_before_s = job.signal_name, job.signal_before_s


def _workdir(workdir: str | None) -> str:
    if not workdir:
        return ""
    if len(workdir) > bounds.WORKDIR_MAX:
        raise ValidationFailed.field("workdir", f"longer than {bounds.WORKDIR_MAX} characters.")
    if not workdir.startswith("/"):
        raise ValidationFailed.field("workdir", "must be an absolute path (start with /).")
    if any(ord(c) < 32 or ord(c) == 127 for c in workdir):
        raise ValidationFailed.field("workdir", "must not contain control characters.")
    return workdir


def _env(env: dict | None) -> dict[str, str]:
    if not env:
        return {}
    if not isinstance(env, dict):
        raise ValidationFailed.field("env", "must be an object of NAME: value.")
    if len(env) > bounds.ENV_VARS_MAX:
        raise ValidationFailed.field("env", f"at most {bounds.ENV_VARS_MAX} variables.")
    total = 0
    for name, value in env.items():
        where = f"env.{name}"
        if not isinstance(name, str) or not ENV_NAME.match(name):
            raise ValidationFailed.field(
                where, "a name is letters, digits and _, not starting with a digit."
            )
        if len(name) > bounds.ENV_NAME_MAX:
            raise ValidationFailed.field(where, f"a name is at most {bounds.ENV_NAME_MAX} long.")
        if job_env_reserved(name):
            raise ValidationFailed.field(where, "is set by the portal for every job.")
        if not isinstance(value, str):
            raise ValidationFailed.field(where, "must be a string.")
        if len(value) > bounds.ENV_VALUE_MAX:
            raise ValidationFailed.field(where, f"longer than {bounds.ENV_VALUE_MAX} characters.")
        if "\x00" in value:
            raise ValidationFailed.field(where, "must not contain NUL characters.")
        total += len(name) + len(value)
    if total > bounds.ENV_TOTAL_MAX:
        raise ValidationFailed.field("env", f"more than {bounds.ENV_TOTAL_MAX} characters in all.")
    return {name: env[name] for name in env}


def _signal(signal: str | None, duration_s: int) -> tuple[str, int | None]:
    if not signal:
        return "", None
    try:
        name, before = signal_parse(signal)
    except ValueError as exc:
        raise ValidationFailed.field("signal", f"{exc} (e.g. USR1@120).") from None
    if before >= duration_s:
        raise ValidationFailed.field(
            "signal",
            f"{before} s before the end is not within the booking's {duration_s} s: ask for "
            f"fewer seconds after @ (e.g. {signal.partition('@')[0].strip()}@{duration_s // 2}).",
        )
    return name, before


def node_count_gpus(
    *, node_count: int | None, gpus: int | None, gpu_model: str | None, mig_profile: str | None
) -> int | None:
    """The whole GPUs of a request for `node_count` nodes (`submit --nodes`), else `gpus`.

    A request wider than one node takes whole nodes (scheduler.placement), so N nodes means N
    times a node's GPUs: `gpus` must be that if given, or is worked out when the nodes of the
    model are all one size.
    """
    if node_count is None:
        return gpus
    if mig_profile:
        raise ValidationFailed.field("node_count", "takes whole GPUs, not a MIG slice.")
    if node_count < 1:
        raise ValidationFailed.field("node_count", "must be at least 1.")
    sizes = _whole_node_sizes(gpu_model)
    if gpus is None:
        if len(sizes) != 1:
            raise ValidationFailed.field(
                "node_count", "the nodes are of different sizes: give gpus as well."
            )
        return node_count * sizes.pop()
    if gpus % node_count:
        raise ValidationFailed.field("gpus", f"must be a multiple of node_count ({node_count}).")
    per_node = gpus // node_count
    if node_count > 1 and per_node not in sizes:
        listed = ", ".join(map(str, sorted(sizes))) or "none"
        raise ValidationFailed.field(
            "node_count",
            f"a job on several nodes takes whole nodes; {per_node} GPUs a node is no node's "
            f"size (whole-GPU nodes{' of ' + gpu_model if gpu_model else ''} have {listed}).",
        )
    return gpus


def _whole_node_sizes(gpu_model: str | None) -> set[int]:
    # Up nodes whose GPUs are all whole (and of the model): the nodes a wide request takes.
    gpus = inventory.gpus_live().filter(node__state=Node.State.UP)
    rows = gpus.values("node_id").annotate(
        total=Count("id"),
        whole=Count("id", filter=Q(mig_mode=False, **({"model": gpu_model} if gpu_model else {}))),
    )
    return {row["total"] for row in rows if row["total"] == row["whole"]}
