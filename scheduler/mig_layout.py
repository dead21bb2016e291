"""MIG layouts: which ones NVIDIA allows per GPU model, and when a planned change can happen.

The profile tables are data, after NVIDIA's MIG user guide ("Supported MIG Profiles" and the
placements ``nvidia-smi mig -lgipp`` lists). A GPU has ``memory_slices`` memory slices (8 on
the 7-compute-slice GPUs, 4 on the A30); an instance of a profile starts at one of the profile's
``starts`` and occupies ``size`` memory slices from there, so two instances overlap exactly when
their memory-slice ranges do. ``start`` is NVIDIA's placement start, which is also the first
compute slice the instance holds.

A pending layout change on a physical GPU (``MigChange``) happens at the earliest time all of
its slices are free (``change_times``): the allocator plans no booking on those slices across
that time (docs/scheduling.md, "MIG layouts that change").
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from scheduler.types import MigChange, State

__all__ = [
    "MODELS",
    "LayoutError",
    "MigChange",
    "Proposal",
    "change_times",
    "layout_validate",
    "mig_model",
    "propose_layouts",
]

NVIDIA_GUIDE = "NVIDIA MIG user guide, Supported MIG Profiles"


@dataclass(frozen=True)
class MigProfileSpec:
    """One MIG profile of one GPU model: compute slices, placement size and starts, limits.

    ``gi_profile`` names NVML's GPU instance profile constant
    (``NVML_GPU_INSTANCE_PROFILE_<gi_profile>``) the agent creates it with.
    """

    name: str
    slices: int
    size: int
    starts: tuple[int, ...]
    max_count: int
    gi_profile: str

    @property
    def memory_gb(self) -> int:
        """The memory its name promises, in GB ("3g.40gb": 40)."""
        return int(self.name.split(".", 1)[1].split("gb", 1)[0])


@dataclass(frozen=True)
class MigModel:
    """The MIG geometry of one GPU model and the profiles NVIDIA allows on it."""

    key: str
    compute_slices: int
    memory_slices: int
    profiles: tuple[MigProfileSpec, ...]

    def profile(self, name: str) -> MigProfileSpec | None:
        """The profile of that name on this model, or None."""
        return next((p for p in self.profiles if p.name == name), None)


def _seven(key: str, one: int, two: int, three: int, four: int, seven: int) -> MigModel:
    """A 7-compute-slice, 8-memory-slice GPU (A100, H100, H200): the profiles differ only in
    their memory sizes."""
    any_slot = (0, 1, 2, 3, 4, 5, 6)
    return MigModel(
        key,
        7,
        8,
        (
            MigProfileSpec(f"1g.{one}gb", 1, 1, any_slot, 7, "1_SLICE"),
            MigProfileSpec(f"1g.{one}gb+me", 1, 1, any_slot, 1, "1_SLICE_REV1"),
            MigProfileSpec(f"1g.{two}gb", 1, 2, (0, 2, 4, 6), 4, "1_SLICE_REV2"),
            MigProfileSpec(f"2g.{two}gb", 2, 2, (0, 2, 4), 3, "2_SLICE"),
            MigProfileSpec(f"3g.{three}gb", 3, 4, (0, 4), 2, "3_SLICE"),
            MigProfileSpec(f"4g.{four}gb", 4, 4, (0,), 1, "4_SLICE"),
            MigProfileSpec(f"7g.{seven}gb", 7, 8, (0,), 1, "7_SLICE"),
        ),
    )


MODELS: dict[str, MigModel] = {
    model.key: model
    for model in (
        _seven("A100-40GB", 5, 10, 20, 20, 40),
        _seven("A100-80GB", 10, 20, 40, 40, 80),
        _seven("H100-80GB", 10, 20, 40, 40, 80),
        _seven("H100-94GB", 12, 24, 47, 47, 94),
        _seven("H200-141GB", 18, 35, 71, 71, 141),
        MigModel(
            "A30-24GB",
            4,
            4,
            (
                MigProfileSpec("1g.6gb", 1, 1, (0, 1, 2, 3), 4, "1_SLICE"),
                MigProfileSpec("1g.6gb+me", 1, 1, (0, 1, 2, 3), 1, "1_SLICE_REV1"),
                MigProfileSpec("2g.12gb", 2, 2, (0, 2), 2, "2_SLICE"),
                MigProfileSpec("2g.12gb+me", 2, 2, (0, 2), 1, "2_SLICE_REV1"),
                MigProfileSpec("4g.24gb", 4, 4, (0,), 1, "4_SLICE"),
            ),
        ),
    )
}


def mig_model(model: str, memory_mib: int) -> MigModel | None:
    """The MIG table of a GPU as the portal knows it (its model name as NVML gives it, less the
    vendor, and its memory): "A100-SXM4-80GB", "H100 80GB HBM3", "H200" ... None: no MIG table
    (not a MIG-capable model, or one this table does not know)."""
    name, gib = model.upper(), memory_mib / 1024
    if "A30" in name:
        return MODELS["A30-24GB"]
    if "H200" in name:
        return MODELS["H200-141GB"]
    if "H100" in name:
        return MODELS["H100-94GB" if gib > 88 else "H100-80GB"]
    if "A100" in name:
        return MODELS["A100-80GB" if gib > 48 else "A100-40GB"]
    return None


class LayoutError(ValueError):
    """A layout NVIDIA does not allow; ``field`` names the instance and part ("instances[2].start")."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}")
        self.field = field
        self.reason = reason


@dataclass(frozen=True)
class PlacedInstance:
    """One instance of a valid layout, at its start."""

    profile: str
    start: int
    slices: int
    size: int
    gi_profile: str
    memory_gb: int

    def span(self) -> str:
        """Its memory slices, "4-7"."""
        return f"{self.start}-{self.start + self.size - 1}" if self.size > 1 else str(self.start)


def layout_validate(
    table: MigModel, instances: Iterable[tuple[str, int | None]]
) -> tuple[PlacedInstance, ...]:
    """Check a layout (each instance a profile name and a start, None: any valid start) against
    ``table`` and place it: the instances by start, or raise LayoutError naming the first
    instance that breaks a rule and why."""
    wanted = list(instances)
    if not wanted:
        raise LayoutError("instances", "a layout has at least one instance")
    if len(wanted) > table.compute_slices:
        raise LayoutError(
            "instances", f"{table.key} holds at most {table.compute_slices} instances"
        )
    specs = [_spec(table, i, name, start) for i, (name, start) in enumerate(wanted)]
    _check_counts(table, specs)
    fixed = [
        (i, spec, start)
        for i, (spec, (_, start)) in enumerate(zip(specs, wanted, strict=True))
        if start is not None
    ]
    _check_overlaps(fixed)
    loose = [
        (i, spec)
        for i, (spec, (_, start)) in enumerate(zip(specs, wanted, strict=True))
        if start is None
    ]
    taken = [(start, spec.size) for _, spec, start in fixed]
    placed = _place_loose(loose, taken)
    if placed is None:
        used = sum(spec.size for spec in specs)
        raise LayoutError(
            "instances",
            f"no placement of these profiles fits together on {table.key} (they need {used} of"
            f" its {table.memory_slices} memory slices at the starts NVIDIA allows)",
        )
    starts = {i: start for i, _, start in fixed} | placed
    result = [
        PlacedInstance(
            spec.name, starts[i], spec.slices, spec.size, spec.gi_profile, spec.memory_gb
        )
        for i, spec in enumerate(specs)
    ]
    return tuple(sorted(result, key=lambda p: p.start))


def _spec(table: MigModel, index: int, name: str, start: int | None) -> MigProfileSpec:
    spec = table.profile(name)
    if spec is None:
        allowed = ", ".join(p.name for p in table.profiles)
        raise LayoutError(
            f"instances[{index}].profile",
            f"{name!r} is not a MIG profile of {table.key} (allowed: {allowed})",
        )
    if start is not None and start not in spec.starts:
        starts = ", ".join(map(str, spec.starts))
        raise LayoutError(
            f"instances[{index}].start",
            f"{name} starts at {starts} on {table.key}, not {start}",
        )
    return spec


def _check_counts(table: MigModel, specs: list[MigProfileSpec]) -> None:
    seen: dict[str, int] = {}
    for i, spec in enumerate(specs):
        seen[spec.name] = seen.get(spec.name, 0) + 1
        if seen[spec.name] > spec.max_count:
            raise LayoutError(
                f"instances[{i}].profile",
                f"{table.key} holds at most {spec.max_count} instance(s) of {spec.name}",
            )


def _check_overlaps(fixed: list[tuple[int, MigProfileSpec, int]]) -> None:
    for n, (i, spec, start) in enumerate(fixed):
        for j, other, other_start in fixed[:n]:
            if start < other_start + other.size and other_start < start + spec.size:
                raise LayoutError(
                    f"instances[{i}].start",
                    f"{spec.name} at {start} overlaps instances[{j}] ({other.name} at"
                    f" {other_start}) on memory slices",
                )


def _place_loose(
    loose: list[tuple[int, MigProfileSpec]], taken: list[tuple[int, int]]
) -> dict[int, int] | None:
    """Starts for the instances given none, without overlap (a small backtracking search: at
    most 7 instances of at most 7 starts each), widest first; None when none exists."""
    order = sorted(loose, key=lambda pair: (-pair[1].size, pair[0]))

    def free(start: int, size: int, spans: list[tuple[int, int]]) -> bool:
        return all(start + size <= s or s + z <= start for s, z in spans)

    def search(k: int, spans: list[tuple[int, int]]) -> dict[int, int] | None:
        if k == len(order):
            return {}
        index, spec = order[k]
        for start in spec.starts:
            if free(start, spec.size, spans):
                rest = search(k + 1, [*spans, (start, spec.size)])
                if rest is not None:
                    return {index: start, **rest}
        return None

    return search(0, list(taken))


# -- planning a change ---------------------------------------------------------------------


def change_times(state: State) -> dict[str, float]:
    """When each pending change of ``state.mig_changes`` happens: the earliest time all slices
    of its GPU are free of the running allocations and advance reservations (``state.now`` at
    the earliest). The allocator plans nothing on those slices from then on."""
    if not state.mig_changes:
        return {}
    gpus = {change.gpu for change in state.mig_changes}
    parent = {dev.id: (dev.parent or dev.id) for dev in state.devices}
    at = dict.fromkeys(gpus, state.now)
    for alloc in state.allocations:
        for device_id in alloc.device_ids:
            gpu = parent.get(device_id, device_id)
            if gpu in at and alloc.end > at[gpu]:
                at[gpu] = alloc.end
    return at


# -- proposing a layout (MIG_AUTO_LAYOUT) --------------------------------------------------


@dataclass(frozen=True)
class Proposal:
    """A layout the allocator proposes for idle GPU ``gpu``: ``profiles`` to place, and why."""

    gpu: str
    profiles: tuple[str, ...]
    reason: str


def propose_layouts(
    state: State, tables: dict[str, MigModel], *, wait_s: float
) -> tuple[Proposal, ...]:
    """For each MIG profile pending bookings have waited at least ``wait_s`` for that no idle
    MIG GPU offers, a layout for one idle MIG GPU whose model has it (``tables``: GPU device id
    -> its model's table; GPUs with a pending change are left out): as many of that profile as
    fit, the rest in the smallest profile. Oldest wait first; one GPU per profile."""
    parents: dict[str, list] = {}
    for device in state.devices:
        if device.parent:
            parents.setdefault(device.parent, []).append(device)
    changing = {change.gpu for change in state.mig_changes}
    busy = {d for a in state.allocations if a.end > state.now for d in a.device_ids}
    idle = [
        gpu
        for gpu, slices in sorted(parents.items())
        if gpu in tables and gpu not in changing and not any(d.id in busy for d in slices)
    ]
    offered = {d.profile for gpu in idle for d in parents[gpu]}
    waited: dict[str, float] = {}
    for request in state.pending:
        age = state.now - request.submit_time
        if request.mig_profile and age >= wait_s and request.mig_profile not in offered:
            waited[request.mig_profile] = max(waited.get(request.mig_profile, 0.0), age)
    proposals, used = [], set()
    for profile, age in sorted(waited.items(), key=lambda pair: (-pair[1], pair[0])):
        gpu = next((g for g in idle if g not in used and tables[g].profile(profile)), None)
        if gpu is None:
            continue
        used.add(gpu)
        reason = f"bookings have waited {age / 60:.0f} min for {profile}, which no idle GPU offers"
        proposals.append(Proposal(gpu, _filled(tables[gpu], profile), reason))
    return tuple(proposals)


def _filled(table: MigModel, profile: str) -> tuple[str, ...]:
    """As many instances of ``profile`` as the table places, then the smallest profile in what
    is left."""
    spec, smallest = table.profile(profile), table.profiles[0]
    chosen: list[str] = []
    for name in [spec.name] * spec.max_count + [smallest.name] * smallest.max_count:
        try:
            layout_validate(table, [(p, None) for p in [*chosen, name]])
        except LayoutError:
            continue
        chosen.append(name)
    return tuple(chosen)
