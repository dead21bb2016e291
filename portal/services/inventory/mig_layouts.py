"""MIG layouts as the portal reads them: a GPU's layout, a layout checked against its model's
NVIDIA table (scheduler.mig_layout), the changes the allocator plans around and what the agent
is to create (docs/scheduling.md, "MIG layouts that change"). The writes (asking, planning,
applying, ending a change) are portal.services.allocation.mig_changes.
"""

from datetime import datetime, timedelta

from agents.protocol import PROFILE_MAX, MigSlot
from portal.errors import ValidationFailed
from portal.models import Gpu, MigLayoutChange
from scheduler.mig_layout import LayoutError, MigChange, layout_validate, mig_model

# The fact every change of a change's state records: its node's agent is told, a pass is asked.
MIG_LAYOUT_CHANGED = "mig_layout_changed"
# An agent told to apply a layout that has not registered the result this long after is
# taken to have failed (it may be down): the change fails and the slices are planned again.
APPLY_TIMEOUT = timedelta(minutes=10)


def gpu_mig_layout(*, gpu: Gpu) -> list[dict]:
    """The GPU's live MIG instances as a layout, by start."""
    rows = gpu.mig_instances.filter(retired_at__isnull=True).order_by("placement_start", "id")
    return [{"profile": p, "start": s} for p, s in rows.values_list("profile", "placement_start")]


def mig_layout_parse(instances) -> list[tuple[str, int | None]]:
    """The request body's instances as (profile, start or None), bounded before anything is
    read from them: a list of at most 8 objects, each a short profile name and a small start."""
    if not isinstance(instances, list):
        raise ValidationFailed.field("instances", "a list of {profile, start} objects")
    if len(instances) > 8:
        raise ValidationFailed.field("instances", "a GPU holds at most 7 MIG instances")
    parsed = []
    for i, item in enumerate(instances):
        if not isinstance(item, dict) or set(item) - {"profile", "start"}:
            raise ValidationFailed.field(f"instances[{i}]", "an object of profile and start")
        profile, start = item.get("profile"), item.get("start")
        if not isinstance(profile, str) or not 0 < len(profile) <= PROFILE_MAX:
            raise ValidationFailed.field(f"instances[{i}].profile", "a MIG profile name")
        if start is not None and (type(start) is not int or not 0 <= start <= 7):
            raise ValidationFailed.field(f"instances[{i}].start", "a whole number from 0 to 7")
        parsed.append((profile, start))
    return parsed


def mig_layout_check(*, gpu: Gpu, instances) -> list[dict]:
    """The placed layout (by start) if NVIDIA allows it on this GPU, or ValidationFailed naming
    the field and why: the GPU is not in MIG mode or has no MIG table, or an instance breaks a
    rule of its model (scheduler.mig_layout)."""
    wanted = mig_layout_parse(instances)
    if not gpu.mig_mode:
        raise ValidationFailed.field("gpu", f"{gpu} is not in MIG mode")
    table = mig_model(gpu.model, gpu.memory_mib)
    if table is None:
        raise ValidationFailed.field("gpu", f"no MIG profiles are known for model {gpu.model}")
    try:
        placed = layout_validate(table, wanted)
    except LayoutError as exc:
        raise ValidationFailed.field(exc.field, exc.reason) from None
    return [{"profile": p.profile, "start": p.start} for p in placed]


def mig_changes_holding() -> tuple[MigChange, ...]:
    """The changes the allocator plans around (requested, planned, applying), as its input."""
    rows = (
        MigLayoutChange.objects.filter(state__in=MigLayoutChange.HOLDING)
        .order_by("id")
        .values_list("gpu_id", "gpu__node__hostname", "gpu__index")
    )
    return tuple(MigChange(f"gpu:{pk}", f"{host}/gpu{index}") for pk, host, index in rows)


def gpus_changing_before(end: datetime):
    """Ids of the GPUs whose MIG layout changes before ``end`` (or at a time not planned yet):
    no reservation may hold their slices past it."""
    changes = MigLayoutChange.objects.filter(state__in=MigLayoutChange.HOLDING)
    return changes.exclude(planned_at__gte=end).values("gpu_id")


def mig_slots(change: MigLayoutChange) -> list[MigSlot]:
    """What the agent creates for a change: each instance with its NVML profile and size."""
    table = mig_model(change.gpu.model, change.gpu.memory_mib)
    slots = []
    for item in change.layout:
        spec = table.profile(item["profile"])
        memory_mib = spec.memory_gb * 1024
        slots.append(
            MigSlot(spec.name, item["start"], spec.slices, spec.size, spec.gi_profile, memory_mib)
        )
    return slots
