"""Node services: agent tokens, inventory from an agent's discovery, node state changes."""

from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from portal.errors import NotAllowed
from portal.models import Booking, Gpu, MigInstance, Node
from portal.models.inventory import MIG_SLICES_PER_GPU
from portal.models.tokens import hash_token, new_token
from portal.services import events, permissions
from portal.services.audit import SYSTEM, Source, audit_record
from portal.services.bookings import booking_stop
from portal.services.notifications import node_down_record


def node_token_issue(*, hostname: str) -> str:
    """Create the node if needed and give it a new agent token (the old one stops working)."""
    raw = new_token("gpa")
    node, _ = Node.objects.get_or_create(hostname=hostname)
    Node.objects.filter(pk=node.pk).update(agent_token_hash=hash_token(raw))
    return raw


def node_token_revoke(*, hostname: str) -> bool:
    """Revoke the node's agent token; False if the node does not exist."""
    return bool(Node.objects.filter(hostname=hostname).update(agent_token_hash=""))


def node_check_hostname(*, node: Node, hostname: str) -> None:
    """Refuse (403) a message in which the agent of `node` speaks for another host."""
    if hostname != node.hostname:
        raise NotAllowed(
            f"This token belongs to {node.hostname}, not {hostname}.",
            fields={"hostname": "not the node this token belongs to"},
        )


def node_for_token(raw: str) -> Node | None:
    """The node this agent token belongs to, or None."""
    if not raw:
        return None
    return Node.objects.filter(agent_token_hash=hash_token(raw)).first()


@transaction.atomic
def node_inventory_update(*, node: Node, gpus: list[dict]) -> None:
    """Make the node's GPUs and MIG instances match what its agent discovered.

    Devices are matched by UUID. A device that disappeared is deleted unless bookings reference
    it (then it stays, and the allocator no longer sees it once its GPU leaves MIG mode, etc.).
    """
    seen_gpus: list[int] = []
    for info in gpus:
        gpu = _gpu_upsert(node, info)
        seen_gpus.append(gpu.pk)
        seen_migs = [_mig_upsert(gpu, m, at).pk for m, at in _placed(info.get("mig_instances", []))]
        gone = gpu.mig_instances.exclude(pk__in=seen_migs).filter(allocations__isnull=True)
        MigInstance.objects.filter(pk__in=gone.values("pk")).delete()
    gone_gpus = node.gpus.exclude(pk__in=seen_gpus).filter(allocations__isnull=True)
    Gpu.objects.filter(pk__in=gone_gpus.values("pk")).delete()


def gpu_model_name(nvml_name: str) -> str:
    """The model as users type it: NVML's product name without the vendor ("NVIDIA H100 80GB HBM3"
    becomes "H100 80GB HBM3")."""
    name = nvml_name.strip()
    return name[len("NVIDIA ") :] if name.upper().startswith("NVIDIA ") else name


def _gpu_upsert(node: Node, info: dict) -> Gpu:
    # Another GPU of this node may hold the index that this UUID now reports (card swapped).
    Gpu.objects.filter(node=node, index=info["index"]).exclude(uuid=info["uuid"]).delete()
    gpu, _ = Gpu.objects.update_or_create(
        uuid=info["uuid"],
        defaults={
            "node": node,
            "index": info["index"],
            "model": gpu_model_name(info["model"]),
            "memory_mib": info["memory_total_mib"],
            "mig_mode": bool(info.get("mig_mode")),
        },
    )
    return gpu


def _placed(migs: list[dict]) -> list[tuple[dict, int]]:
    """Each MIG instance with its first compute slice: packed in the order the agent lists them."""
    placed, start = [], 0
    for mig in migs:
        placed.append((mig, min(start, MIG_SLICES_PER_GPU - mig["slices"])))
        start += mig["slices"]
    return placed


def _mig_upsert(gpu: Gpu, info: dict, placement_start: int) -> MigInstance:
    mig, _ = MigInstance.objects.update_or_create(
        uuid=info["uuid"],
        defaults={
            "gpu": gpu,
            "profile": info["profile"],
            "slices": info["slices"],
            "placement_start": placement_start,
            "memory_mib": info["memory_total_mib"],
        },
    )
    return mig


def node_inventory_from_spec(*, hostname: str, spec: str, site: str = "") -> Node:
    """Create a node with the inventory a simulated agent of this SPEC will report (demo, tests).

    `site` is the agent's --site-id (the demo's: portal.services.demo.demo_site_id): the UUIDs
    derive from it, and a device the agent reports under another UUID would be replaced.
    """
    from agents.protocol import to_json
    from agents.simulate import SimulatedBackend

    node, _ = Node.objects.get_or_create(hostname=hostname)
    backend = SimulatedBackend(spec, hostname=hostname, site=site)
    node_inventory_update(node=node, gpus=[to_json(gpu) for gpu in backend.discover()])
    backend.close()
    return node


# Heartbeats closer together than this are not written again (agents post several times a
# second under load; the heartbeat timeout is a minute).
HEARTBEAT_WRITE_INTERVAL = timedelta(seconds=1)


def node_mark_seen(*, node: Node, agent_version: str = "") -> bool:
    """Record a heartbeat; a node that was down comes back up (True then) and may get work.

    `node` should be freshly read (as token authentication does): its state and last_seen decide
    whether anything needs writing.
    """
    now = timezone.now()
    recent = node.last_seen is not None and now - node.last_seen < HEARTBEAT_WRITE_INTERVAL
    if recent and node.state != Node.State.DOWN and not agent_version:
        return False
    fields = {"last_seen": now}
    if agent_version:
        fields["agent_version"] = agent_version
    Node.objects.filter(pk=node.pk).update(**fields)
    if node.state != Node.State.DOWN and not _may_be_going_down(node, now):
        return False
    # The write above waited for any node-down scan holding the row, so this compare-and-set
    # (a new statement, a new snapshot) sees a down that committed meanwhile: a heartbeat that
    # was recorded never leaves the node down.
    came_up = Node.objects.filter(pk=node.pk, state=Node.State.DOWN).update(
        state=Node.State.UP, state_reason=""
    )
    if came_up:
        events.request_allocation_pass()
    return bool(came_up)


def _may_be_going_down(node: Node, now: datetime) -> bool:
    """Whether a node-down scan may be marking the node (as read, up) down right now: its last
    heartbeat is old enough for a scan to call it silent (half the timeout: clocks may differ)."""
    if node.state != Node.State.UP:
        return False
    timeout = timedelta(seconds=settings.NODE_HEARTBEAT_TIMEOUT_S)
    return node.last_seen is None or now - node.last_seen >= timeout / 2


def nodes_heartbeat_check(*, now: datetime) -> list[str]:
    """Mark up nodes silent for NODE_HEARTBEAT_TIMEOUT_S as down and end their active bookings.

    Each node goes down by compare-and-set (a heartbeat racing in keeps it up). Its active
    bookings fail; batch ones (a command, no fixed window) go back to the queue, keeping their
    submit time, when REQUEUE_ON_NODE_FAILURE. Returns the hostnames marked down.
    """
    cutoff = now - timedelta(seconds=settings.NODE_HEARTBEAT_TIMEOUT_S)
    stale = Node.objects.filter(state=Node.State.UP, last_seen__lt=cutoff)
    return [
        hostname
        for node_id, hostname in stale.values_list("pk", "hostname")
        if _node_down(node_id, hostname, cutoff, now)
    ]


def _node_down(node_id: int, hostname: str, cutoff: datetime, now: datetime) -> bool:
    reason = f"node {hostname} stopped reporting"
    with transaction.atomic(durable=True):
        if not Node.objects.filter(pk=node_id, state=Node.State.UP, last_seen__lt=cutoff).update(
            state=Node.State.DOWN, state_reason=f"no heartbeat since {cutoff:%H:%M:%S} UTC"
        ):
            return False
        held = Booking.objects.filter(
            state=Booking.State.ACTIVE, allocations__live=True, allocations__gpu__node_id=node_id
        ).distinct()
        for booking in held:
            _fail_booking(booking, reason, now)
        node_down_record(node_id=node_id, hostname=hostname, reason=reason, now=now)
        events.request_allocation_pass()
    return True


def _fail_booking(booking: Booking, reason: str, now: datetime) -> None:
    booking_stop(booking_id=booking.pk, to=Booking.State.FAILED, now=now, detail=reason)


def node_drain(*, node_ids, actor, source: Source = SYSTEM) -> int:
    """Drain nodes (running work finishes, nothing new is placed); each change audited."""
    reason = f"drained by {actor.get_username()}"
    return _node_set_state(
        node_ids, Node.State.DRAIN, reason, "node.drain", actor, source, exclude=Node.State.DRAIN
    )


def node_return_to_service(*, node_ids, actor, source: Source = SYSTEM) -> int:
    """Put drained nodes back in service; each change audited. Returns how many changed."""
    return _node_set_state(
        node_ids, Node.State.UP, "", "node.return", actor, source, only=Node.State.DRAIN
    )


def _node_set_state(node_ids, state, reason, action, actor, source, *, only=None, exclude=None):
    if not permissions.can(actor, "node.drain"):
        raise NotAllowed("Only admins with the right to change nodes may drain them.")
    changed = 0
    for node in Node.objects.filter(pk__in=list(node_ids)).order_by("pk"):
        if node.state == exclude or (only and node.state != only):
            continue
        with transaction.atomic(durable=True):
            # Compare-and-set: a heartbeat that marked the node down meanwhile wins.
            rows = Node.objects.filter(pk=node.pk, state=node.state)
            if not rows.update(state=state, state_reason=reason):
                continue
            audit_record(
                action=action,
                actor=actor,
                source=source,
                target=node,
                before={"state": node.state, "state_reason": node.state_reason},
                after={"state": state, "state_reason": reason},
            )
            changed += 1
    if changed:
        events.request_allocation_pass()
    return changed
