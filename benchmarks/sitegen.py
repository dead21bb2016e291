"""A generated site for the allocator and pass benchmarks: realistic shapes, shared by both.

Plain data (no Django, no scheduler import) so bench_allocator.py turns it into a scheduler
``State`` and bench_pass.py writes it into PostgreSQL; both time the same site.

Defaults (the issue's site): 1,024 GPUs in 128 nodes of 8, four GPU models, 2 nodes in MIG mode
(one 7 x 1g.10gb per GPU, one 3g.40gb + 3g.40gb + 1g.10gb per GPU); 95 % of the devices that
no reservation holds are running
(2,000 allocation rows with the finished ones of the budget period), 100 advance reservations,
10,000 pending bookings with durations to the second (1 min to 3 days), widths from one MIG slice
to 64 GPUs, a quarter of them asking for a model; 300 users in 40 projects with a concurrency
quota and a GPU-hour budget on every user and every project.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field, replace

HOUR = 3600
MODELS = ("A100-80GB", "H100-80GB", "L40S", "A40")
MIG_LAYOUTS = (("1g.10gb",) * 7, ("3g.40gb", "3g.40gb", "1g.10gb"))
WIDTHS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)
WIDTH_WEIGHTS = (40, 14, 3, 12, 2, 12, 2, 6, 2, 4, 1, 2)


@dataclass
class SiteDevice:
    """One allocatable device: (node index, gpu index, mig index or None)."""

    id: str
    node: int
    gpu: int
    model: str
    profile: str | None = None
    slices: int = 7
    mig: int | None = None
    shared: bool = False  # a GPU in sharing mode: fractions only (``with_shared``)

    @property
    def fraction(self) -> float:
        return 1.0 if self.profile is None else self.slices / 7


@dataclass
class SiteBooking:
    """A running booking, an advance reservation or a pending request (times relative to now)."""

    key: str
    user: int
    project: int
    duration_s: int
    submitted_ago_s: int
    gpus: int = 1
    mig_profile: str | None = None
    gpu_model: str | None = None
    qos: str = "normal"
    preemptible: bool = False
    devices: tuple[str, ...] = ()
    start_in_s: int = 0  # running: negative (started that long ago); reservation: positive
    command: str = ""
    gpu_fraction: float | None = None  # a fraction of one shared GPU (``with_shared``)


@dataclass
class Site:
    """Everything the benchmarks build."""

    nodes: int
    devices: list[SiteDevice]
    users: int
    projects: int
    user_project: list[int]
    user_quotas: list[tuple[float, float]]  # (max_gpus, gpu_hours_budget)
    project_quotas: list[tuple[float, float, float]]  # (max_gpus, budget, shares)
    running: list[SiteBooking] = field(default_factory=list)
    finished: list[SiteBooking] = field(default_factory=list)
    reservations: list[SiteBooking] = field(default_factory=list)
    pending: list[SiteBooking] = field(default_factory=list)


def _devices(nodes: int, mig_nodes: int) -> list[SiteDevice]:
    out = []
    for n in range(nodes):
        model = MODELS[n * len(MODELS) // nodes]
        layout = MIG_LAYOUTS[n % 2] if n < mig_nodes else None
        for g in range(8):
            if layout is None:
                out.append(SiteDevice(f"n{n}g{g}", n, g, model))
                continue
            for k, profile in enumerate(layout):
                slices = int(profile[0])
                out.append(SiteDevice(f"n{n}g{g}m{k}", n, g, model, profile, slices, k))
    return out


def _request(rng: random.Random, key: str, users: int, user_project: list[int]) -> SiteBooking:
    user = rng.randrange(users)
    kind = rng.random()
    gpus, profile, model = 1, None, None
    if kind < 0.12:
        profile = "1g.10gb" if kind < 0.08 else "3g.40gb"
        model = MODELS[0]
    else:
        gpus = rng.choices(WIDTHS, weights=WIDTH_WEIGHTS)[0]
        if rng.random() < 0.25:
            model = rng.choice(MODELS)
    return SiteBooking(
        key,
        user,
        user_project[user],
        duration_s=rng.randint(60, 3 * 86400),
        submitted_ago_s=rng.randint(0, 7 * 86400),
        gpus=gpus,
        mig_profile=profile,
        gpu_model=model,
        qos=rng.choices(["low", "normal", "high"], weights=[20, 75, 5])[0],
        preemptible=rng.random() < 0.2,
        command="python train.py",
    )


def generate(
    *, pending: int = 10_000, gpus: int = 1024, seed: int = 1, reservations: int = 100
) -> Site:
    """The site for ``gpus`` GPUs (nodes of 8) and ``pending`` queued bookings."""
    rng = random.Random(seed)
    nodes = max(4, gpus // 8)
    devices = _devices(nodes, mig_nodes=2)
    users = max(30, 300 * gpus // 1024)
    projects = max(4, users * 40 // 300)
    user_project = [u % projects for u in range(users)]
    site = Site(
        nodes,
        devices,
        users,
        projects,
        user_project,
        user_quotas=[
            (float(rng.choice([8, 16, 32, 64])), float(rng.randint(2, 20) * 1000))
            for _ in range(users)
        ],
        project_quotas=[
            (float(rng.choice([64, 128, 256])), float(rng.randint(50, 200) * 1000), 1.0 + p % 3)
            for p in range(projects)
        ],
    )
    free = list(devices)
    rng.shuffle(free)
    reserved = set()
    for i, device in enumerate(free[:reservations]):
        user = rng.randrange(users)
        site.reservations.append(
            SiteBooking(
                f"adv{i}",
                user,
                user_project[user],
                duration_s=4 * HOUR,
                submitted_ago_s=86400,
                devices=(device.id,),
                start_in_s=rng.randint(2 * HOUR, 72 * HOUR),
                gpu_model=device.model,
                mig_profile=device.profile,
            )
        )
        reserved.add(device.id)
    # Running bookings fill 95 % of the other devices (a reserved device is idle until then).
    others = [d for d in free if d.id not in reserved]
    busy = others[: int(len(others) * 0.95)]
    i = 0
    while busy:
        # Running bookings of 1-8 devices of one node; devices of a node stay together.
        first = busy.pop()
        group = [first] + [d for d in busy if d.node == first.node and d.profile == first.profile][
            : rng.choice([0, 0, 0, 1, 3, 7])
        ]
        for d in group[1:]:
            busy.remove(d)
        user = rng.randrange(users)
        started = rng.randint(60, 20 * HOUR)
        site.running.append(
            SiteBooking(
                f"run{i}",
                user,
                user_project[user],
                duration_s=started + rng.randint(60, 30 * HOUR),
                submitted_ago_s=started + 600,
                gpus=0 if first.profile else len(group),
                mig_profile=first.profile,
                devices=tuple(d.id for d in group),
                start_in_s=-started,
                qos=rng.choice(["low", "normal"]),
                preemptible=rng.random() < 0.3,
                command="python train.py",
            )
        )
        i += 1
    rows = sum(len(b.devices) for b in site.running)
    for j in range(max(0, 2000 - rows)):
        user = rng.randrange(users)
        device = rng.choice(devices)
        ago = rng.randint(2 * HOUR, 20 * 86400)
        site.finished.append(
            SiteBooking(
                f"fin{j}",
                user,
                user_project[user],
                duration_s=rng.randint(600, ago - HOUR),
                submitted_ago_s=ago + 60,
                gpus=0 if device.profile else 1,
                mig_profile=device.profile,
                devices=(device.id,),
                start_in_s=-ago,
            )
        )
    site.pending = [_request(rng, f"b{i:05d}", users, user_project) for i in range(pending)]
    return site


def _cube_mesh(index: int) -> set[int]:
    return {j for j in range(8) if j != index and (j // 4 == index // 4 or j == (index + 4) % 8)}


def with_topology(state):
    """``state`` with cube-mesh NVLink and NUMA on every other 8-GPU node, racks of 4 nodes."""
    by_node: dict[str, list] = {}
    for device in state.devices:
        by_node.setdefault(device.node, []).append(device)
    devices = []
    for number, (_node, members) in enumerate(sorted(by_node.items())):
        group = f"rack{number // 4}"
        whole = len(members) == 8 and all(d.profile is None for d in members)
        if not whole or number % 2:
            devices += [replace(d, group=group) for d in members]
            continue
        ids = [d.id for d in sorted(members, key=lambda d: d.id)]
        for i, device in enumerate(sorted(members, key=lambda d: d.id)):
            links = tuple(ids[j] for j in sorted(_cube_mesh(i)))
            devices.append(replace(device, links=links, numa=i // 4, group=group))
    return replace(state, devices=tuple(devices))


# The fractions openb_gpushare.csv's pods ask (FGD paper, ATC'23), with how many pods ask each:
# 2,573 pods (tests/scheduler/test_sched_packing.py checks the table against the trace).
OPENB_FRACTIONS = (
    (0.81, 1017),
    (0.47, 455),
    (0.32, 288),
    (0.65, 218),
    (0.46, 128),
    (0.23, 94),
    (0.55, 71),
    (0.16, 70),
    (0.59, 62),
    (0.22, 60),
    (0.37, 46),
    (0.48, 19),
    (0.11, 18),
    (0.05, 7),
    (0.33, 7),
    (0.35, 5),
    (0.27, 4),
    (0.44, 2),
    (0.14, 1),
    (0.29, 1),
)


def with_shared(site: Site, *, shared_nodes: int, fractional: int, seed: int = 1) -> Site:
    """``site`` with ``shared_nodes`` more nodes of 8 shared A100-80GB GPUs, each running
    fractions drawn from ``OPENB_FRACTIONS`` until the next draw would pass 90 % of its compute
    (the first always runs), and
    ``fractional`` more pending bookings each asking a fraction of one shared GPU."""
    rng = random.Random(seed)
    values = [value for value, _ in OPENB_FRACTIONS]
    weights = [count for _, count in OPENB_FRACTIONS]
    first = site.nodes
    for n in range(first, first + shared_nodes):
        for g in range(8):
            device = SiteDevice(f"n{n}g{g}", n, g, MODELS[0], shared=True)
            site.devices.append(device)
            used = 0.0
            while True:
                fraction = rng.choices(values, weights)[0]
                if used + fraction > 0.9:
                    break
                used += fraction
                site.running.append(
                    _fraction_booking(rng, site, f"runf{len(site.running)}", fraction, device.id)
                )
    site.nodes += shared_nodes
    for i in range(fractional):
        fraction = rng.choices(values, weights)[0]
        site.pending.append(_fraction_booking(rng, site, f"f{i:05d}", fraction, None))
    return site


def _fraction_booking(rng, site: Site, key: str, fraction: float, device: str | None):
    user = rng.randrange(site.users)
    started = rng.randint(60, 8 * HOUR)
    booking = SiteBooking(
        key,
        user,
        site.user_project[user],
        duration_s=rng.randint(600, 12 * HOUR),
        submitted_ago_s=rng.randint(0, 2 * 86400),
        gpus=1,
        qos="normal",
        command="jupyter lab",
        gpu_fraction=fraction,
    )
    if device is not None:  # running since ``started`` on that GPU
        booking.devices, booking.start_in_s = (device,), -started
        booking.duration_s += started
        booking.submitted_ago_s = started + 60
    return booking
