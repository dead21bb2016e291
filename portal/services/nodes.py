"""Node services: agent tokens, inventory from an agent's discovery, node state changes."""

from django.db import transaction
from django.utils import timezone

from portal.models import Gpu, MigInstance, Node
from portal.models.tokens import hash_token, new_token


def node_token_issue(*, hostname: str) -> str:
    """Create the node if needed and give it a new agent token (the old one stops working)."""
    raw = new_token("gpa")
    node, _ = Node.objects.get_or_create(hostname=hostname)
    Node.objects.filter(pk=node.pk).update(agent_token_hash=hash_token(raw))
    return raw


def node_token_revoke(*, hostname: str) -> bool:
    """Revoke the node's agent token; False if the node does not exist."""
    return bool(Node.objects.filter(hostname=hostname).update(agent_token_hash=""))


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
        seen_migs = [_mig_upsert(gpu, m).pk for m in info.get("mig_instances", [])]
        gone = gpu.mig_instances.exclude(pk__in=seen_migs).filter(allocations__isnull=True)
        MigInstance.objects.filter(pk__in=gone.values("pk")).delete()
    gone_gpus = node.gpus.exclude(pk__in=seen_gpus).filter(allocations__isnull=True)
    Gpu.objects.filter(pk__in=gone_gpus.values("pk")).delete()


def _gpu_upsert(node: Node, info: dict) -> Gpu:
    # Another GPU of this node may hold the index that this UUID now reports (card swapped).
    Gpu.objects.filter(node=node, index=info["index"]).exclude(uuid=info["uuid"]).delete()
    gpu, _ = Gpu.objects.update_or_create(
        uuid=info["uuid"],
        defaults={
            "node": node,
            "index": info["index"],
            "model": info["model"],
            "memory_mib": info["memory_total_mib"],
            "mig_mode": bool(info.get("mig_mode")),
        },
    )
    return gpu


def _mig_upsert(gpu: Gpu, info: dict) -> MigInstance:
    mig, _ = MigInstance.objects.update_or_create(
        uuid=info["uuid"],
        defaults={
            "gpu": gpu,
            "profile": info["profile"],
            "slices": info["slices"],
            "memory_mib": info["memory_total_mib"],
        },
    )
    return mig


def node_inventory_from_spec(*, hostname: str, spec: str) -> Node:
    """Create a node with the inventory a simulated agent of this SPEC will report (demo, tests)."""
    from agents.protocol import to_json
    from agents.simulate import SimulatedBackend

    node, _ = Node.objects.get_or_create(hostname=hostname)
    backend = SimulatedBackend(spec, hostname=hostname)
    node_inventory_update(node=node, gpus=[to_json(gpu) for gpu in backend.discover()])
    backend.close()
    return node


def node_mark_seen(*, node: Node, agent_version: str = "") -> None:
    """Record a heartbeat; a node that was down comes back up."""
    now = timezone.now()
    fields = {"last_seen": now}
    if agent_version:
        fields["agent_version"] = agent_version
    Node.objects.filter(pk=node.pk).update(**fields)
    Node.objects.filter(pk=node.pk, state=Node.State.DOWN).update(
        state=Node.State.UP, state_reason=""
    )
