"""The seeded demo: users, two projects with quotas, three simulated nodes of 8 GPUs (one GPU
shared), a weekly project reservation, and a queue (some bookings running, one of them an
outsider's short one before the reservation's window, some waiting for different reasons, a
reservation later on, fractions sharing a GPU)."""

import secrets
import time
from collections.abc import Callable
from datetime import datetime, timedelta

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import transaction
from django.utils import timezone

from portal.models import (
    Allocation,
    Booking,
    Gpu,
    Membership,
    Node,
    Project,
    ProjectReservation,
    Quota,
)
from portal.services.allocation.allocation import allocation_pass
from portal.services.booking.bookings import booking_submit
from portal.services.booking.project_reservations import (
    reservation_create,
    reservation_spec,
    reservation_update,
)
from portal.services.fleet.nodes import node_inventory_from_spec

DEMO_PASSWORD = "gpu-demo-2026"
# hostname -> simulated agent SPEC (see docs/agent.md); one node has MIG slices. The topology
# ("@...") changes no device id: an H100 node on an NVSwitch, an A100 PCIe node with two NUMA
# domains. Cores and host memory as such servers have them: a DGX H100's 2 x 56 cores and
# 2 TiB, an A100 server's 2 x 64 cores and 1 TiB.
DEMO_NODES = {
    "gpu-a01": "8xH100-80GB,cpus=112,mem=2T@nvswitch",
    "gpu-a02": "8xA100-80GB,cpus=128,mem=1T@pcie",
    "gpu-a03": "4xA100-80GB,4xA100-80GB:mig=3g.40gb+2g.20gb+1g.10gb+1g.10gb,cpus=128,mem=1T",
}
# The GPU the demo shares (docs/scheduling.md, Shared GPUs): fractions only, several at once.
DEMO_SHARED_GPU = ("gpu-a03", 3)
DEMO_USERS = [
    # username, first name, is_staff
    ("admin", "Ada", True),
    ("alice", "Alice", False),
    ("bob", "Bob", False),
    ("carol", "Carol", False),
]
DEMO_PROJECTS = [
    # slug, name, {user: role}, quota
    (
        "vision",
        "Vision lab",
        {"alice": "member", "carol": "manager"},
        {
            "max_gpus": 12,
            "gpu_hours_budget": 2000,
            "max_duration_s": 7 * 86400,
            "fairshare_shares": 2,
            "allowed_qos": ["low", "normal", "high"],
        },
    ),
    (
        "nlp",
        "Language models",
        {"bob": "member", "carol": "member"},
        {
            "max_gpus": 16,
            "gpu_hours_budget": 4000,
            "max_duration_s": 3 * 86400,
            "fairshare_shares": 1,
            "allowed_qos": ["low", "normal"],
        },
    ),
]


@transaction.atomic
def demo_seed() -> dict:
    """Create (or bring back to shape) the demo users and projects. Idempotent."""
    users = {name: _user(name, first, staff) for name, first, staff in DEMO_USERS}
    for slug, name, members, limits in DEMO_PROJECTS:
        project, _ = Project.objects.update_or_create(slug=slug, defaults={"name": name})
        for username, role in members.items():
            Membership.objects.update_or_create(
                project=project, user=users[username], defaults={"role": role}
            )
        Quota.objects.update_or_create(project=project, user=None, defaults=limits)
    return users


def demo_site_id() -> str:
    """This install's id, made once and kept in VAR_DIR/agents/site-id.

    The simulated devices' UUIDs derive from it and the hostname: `up` gives it to the demo
    agents and demo_nodes_seed builds the same devices, so a seed after the agents registered
    (every start of `up`) finds the very devices they reported.
    """
    path = settings.VAR_DIR / "agents" / "site-id"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(secrets.token_hex(8))
    return path.read_text().strip()


def demo_nodes_seed() -> list[str]:
    """Create (or leave as they are) the demo nodes with the devices their agents will report."""
    site = demo_site_id()
    for hostname, spec in DEMO_NODES.items():
        node_inventory_from_spec(hostname=hostname, spec=spec, site=site)
    _share_demo_gpu()
    return list(DEMO_NODES)


def _share_demo_gpu() -> None:
    """Put the demo's shared GPU in sharing mode, unless a whole-GPU booking holds it now (a
    visitor's, on a later start of `up`): the two never mix."""
    hostname, index = DEMO_SHARED_GPU
    gpu = Gpu.objects.filter(
        node__hostname=hostname, index=index, mig_mode=False, retired_at__isnull=True
    )
    whole = Allocation.objects.filter(gpu__in=gpu, live=True, gpu_memory_mib__isnull=True)
    if not whole.exists():
        gpu.update(sharing=Gpu.Sharing.SHARED)


def _user(username: str, first_name: str, staff: bool):
    User = get_user_model()
    user, created = User.objects.get_or_create(
        username=username,
        defaults={
            "first_name": first_name,
            "email": f"{username}@example.org",
            "is_staff": staff,
            "is_superuser": staff,
        },
    )
    if created:
        user.set_password(DEMO_PASSWORD)
        user.save()
    return user


# The queue the demo opens with: (user, project, request). Running ones hold their devices with a
# command that keeps them busy (so idle reclaim, on in the demo, leaves them be); the rest wait.
# With the quotas above: alice's second H100 booking waits for devices (resources); carol's
# A100s fit now but vision would hold 12.75 of its 12 GPUs: with borrowing on (the demo turns
# QUOTA_BORROWING on) they start borrowed at once, a batch job that gets SIGUSR1 a minute before
# it is stopped, and a booking of nlp within its quota that needs A100s reclaims them. On the
# shared GPU, alice's and bob's quarters and carol's half run at once; bob's second quarter
# waits for room there (resources), with a planned start when the first of them ends.
DEMO_RUNNING = [
    ("alice", "vision", {"gpus": 8, "gpu_model": "H100-80GB", "duration_s": 4 * 3600}),
    ("bob", "nlp", {"gpus": 2, "gpu_model": "A100-80GB", "duration_s": 3 * 3600}),
    ("bob", "nlp", {"mig_profile": "3g.40gb", "duration_s": 2 * 3600}),
    ("alice", "vision", {"gpu_fraction": 0.25, "duration_s": 3 * 3600}),
    ("bob", "nlp", {"gpu_fraction": 0.25, "duration_s": 2 * 3600}),
    ("carol", "vision", {"gpu_fraction": 0.5, "duration_s": 90 * 60}),
]
DEMO_WAITING = [
    ("alice", "vision", {"gpus": 3, "gpu_model": "H100-80GB", "duration_s": 3600}),
    ("bob", "nlp", {"gpu_fraction": 0.25, "duration_s": 3600}),
]
DEMO_BORROWED = [
    (
        "carol",
        "vision",
        {"gpus": 4, "gpu_model": "A100-80GB", "duration_s": 2 * 3600, "signal": "USR1@60"},
    ),
]
# A reservation of two A100s, starting this long after the demo's queue is made, for two hours.
DEMO_RESERVATION_IN = timedelta(hours=2)
DEMO_WAITS = (Booking.State.PENDING, Booking.State.PLANNED)
# The demo's own bookings carry this idempotency key prefix (a visitor's never do).
DEMO_KEY = "demo-queue-"
# The vision lab's weekly class: a project reservation of 4 A100s for two hours, its next window
# opening this long after the queue is made. Bob (nlp, an outsider) runs a short booking on A100s
# that ends before it opens.
DEMO_CLASS_NOTE = "demo: the vision lab's weekly class"
DEMO_CLASS_IN = timedelta(hours=3)
DEMO_CLASS = {"gpus": 4, "gpu_model": "A100-80GB", "weekly": True, "idle_release_minutes": 30}
DEMO_BEFORE_CLASS = ("bob", "nlp", {"gpus": 2, "gpu_model": "A100-80GB", "duration_s": 1800})


def demo_reservation_seed(*, now: datetime) -> ProjectReservation:
    """Create, or move to the next half hour DEMO_CLASS_IN from ``now``, the demo's weekly
    project reservation (needs the demo nodes' devices)."""
    start = _next_half_hour(now + DEMO_CLASS_IN)
    spec = reservation_spec(
        project="vision",
        start=start,
        end=start + timedelta(hours=2),
        now=now,
        note=DEMO_CLASS_NOTE,
        **DEMO_CLASS,
    )
    existing = ProjectReservation.objects.filter(note=DEMO_CLASS_NOTE).order_by("id").first()
    if existing is not None:
        return reservation_update(reservation=existing, spec=spec)
    return reservation_create(user=None, spec=spec)


def demo_queue_seed(*, clock: Callable[[], datetime] = timezone.now) -> list[int]:
    """Submit the demo's queue unless the last one still has bookings waiting (a restart of `up`
    soon after finds the queue it left; one days later, when all of it has run, gets a new one).
    Needs the demo nodes up (their agents registered) so the running ones start at once. The
    ids of the bookings made; none when it left things be.

    Each step reads `clock` afresh: the passes the submits ask for run at the time they run, and
    a pass with an earlier time would see the devices just started as not started yet."""
    seeded = Booking.objects.filter(idempotency_key__startswith=DEMO_KEY)
    if seeded.filter(state__in=DEMO_WAITS).exists():
        return []
    users = [name for name, _, _ in DEMO_USERS]
    people = {u.username: u for u in get_user_model().objects.filter(username__in=users)}
    batch = f"{DEMO_KEY}{secrets.token_hex(4)}-"
    made: list[int] = []

    def submit(username: str, project: str, request: dict, *, busy: bool = False) -> None:
        command = f"sleep {request['duration_s']}" if busy else ""
        booking = booking_submit(
            user=people[username],
            now=clock(),
            project=project,
            command=command,
            idempotency_key=f"{batch}{len(made)}",
            **request,
        )
        made.append(booking.pk)

    demo_reservation_seed(now=clock())
    for entry in DEMO_RUNNING:
        submit(*entry, busy=True)
    _pass(clock)
    submit(*DEMO_BEFORE_CLASS, busy=True)
    _pass(clock)
    start = _next_half_hour(clock() + DEMO_RESERVATION_IN)
    submit(
        "bob",
        "nlp",
        {"gpus": 2, "gpu_model": "A100-80GB", "start": start, "end": start + timedelta(hours=2)},
    )
    for entry in DEMO_WAITING:
        submit(*entry)
    for entry in DEMO_BORROWED:
        submit(*entry, busy=True)
    _pass(clock)
    return made


def demo_nodes_up() -> bool:
    """Whether every demo node's agent has registered (the node is up)."""
    up = Node.objects.filter(hostname__in=list(DEMO_NODES), state=Node.State.UP).count()
    return up == len(DEMO_NODES)


def _pass(clock: Callable[[], datetime], attempts: int = 50) -> None:
    # Another pass (the periodic one) may hold the pass lock a moment; this one must run.
    for _ in range(attempts):
        if allocation_pass(now=clock()).ran:
            return
        time.sleep(0.1)


def _next_half_hour(moment: datetime) -> datetime:
    # At or after ``moment``: carol's two hours end before the reservation begins, even when
    # the queue is made a few seconds past a full or half hour.
    floor = moment.replace(second=0, microsecond=0)
    if floor < moment:
        floor += timedelta(minutes=1)
    return floor + timedelta(minutes=(30 - floor.minute % 30) % 30)
