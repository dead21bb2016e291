"""Node services: agent tokens, inventory from an agent's discovery, node state changes."""

from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from agents.protocol import HOSTNAME_RULE, is_hostname
from portal.errors import NotAllowed, ValidationFailed
from portal.models import Allocation, Booking, Gpu, MigInstance, Node, NodeHeartbeat
from portal.models.inventory import MIG_SLICES_PER_GPU
from portal.models.tokens import hash_token, new_token
from portal.services.access import permissions
from portal.services.access.audit import SYSTEM, Source, audit_record
from portal.services.booking import events
from portal.services.booking.bookings import booking_stop
from portal.services.booking.reservations import reservation_move_off_retired
from portal.services.core.locking import lock_nodes
from portal.services.core.outbox import fact_record
from portal.services.inventory.resources import live_holdings, node_capacities


def node_token_issue(*, hostname: str) -> str:
    """Create the node if needed and give it a new agent token (the old one stops working).

    The name reaches other nodes' hostfiles and launch variables: an RFC 1123 host name only.
    """
    if not is_hostname(hostname):
        raise ValidationFailed.field("hostname", f"{hostname!r} {HOSTNAME_RULE}.")
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


@transaction.atomic
def node_inventory_update(*, node: Node, gpus: list[dict]) -> None:
    """Make the node's live GPUs and MIG instances exactly what its agent reported.

    Devices are matched by UUID; a reported one is live at the index it reports (a retired one
    comes back, a card retired on another node moves here). A device not reported (removed,
    replaced at its index, a MIG instance of an old layout or of a GPU that left MIG mode) is
    retired if any allocation ever used it, and deleted if none did: one rule, so history,
    accounting and audit keep every device that was booked. Active bookings on a retired device
    stop (batch jobs requeue) and planned reservations move or fail, with the reason.
    """
    _check_indexes_unique(gpus)
    # The node's row is what a start of the allocation pass locks before it re-checks its
    # devices: holding it, no booking starts on a device between its retirement and the
    # stop below.
    lock_nodes([node.pk])
    now = timezone.now()
    reported = {info["uuid"]: info for info in gpus}
    by_index = {info["index"]: info["uuid"] for info in gpus}
    gone: list[tuple[Q, str]] = []
    for gpu in node.gpus.filter(retired_at__isnull=True).exclude(uuid__in=reported):
        new = by_index.get(gpu.index)
        change = f"replaced (new UUID {new})" if new else "removed"
        gone.append((Q(gpu_id=gpu.pk), f"GPU {gpu.index} of {node.hostname} was {change}"))
        _gpu_retire(gpu, now)
    _slots_free(node, gpus, now)
    for info in gpus:
        gpu, was_whole = _gpu_upsert(node, info)
        if was_whole and gpu.mig_mode:
            reason = f"GPU {gpu.index} of {node.hostname} entered MIG mode"
            gone.append((Q(gpu_id=gpu.pk, mig_instance__isnull=True), reason))
        gone += _migs_update(gpu, info.get("mig_instances", []), now)
    _bookings_settle(gone, now)


def _migs_update(gpu: Gpu, migs: list[dict], now: datetime) -> list[tuple[Q, str]]:
    """Make the GPU's live MIG instances the reported ones; the retired ones, with why."""
    seen = [_mig_upsert(gpu, m, at).pk for m, at in _placed(migs)]
    stale = gpu.mig_instances.filter(retired_at__isnull=True).exclude(pk__in=seen)
    why = "a new MIG layout" if gpu.mig_mode else "the GPU left MIG mode"
    gone = []
    for mig in stale:
        where = f"GPU {gpu.index} of {gpu.node.hostname}"
        reason = f"MIG instance {mig.profile} ({mig.uuid}) of {where} was removed ({why})"
        gone.append((Q(mig_instance_id=mig.pk), reason))
        _mig_retire(mig, now)
    return gone


def _check_indexes_unique(gpus: list[dict]) -> None:
    seen: set[int] = set()
    for i, info in enumerate(gpus):
        if info["index"] in seen:
            raise ValidationFailed.field(f"gpus[{i}].index", "the same index as another GPU")
        seen.add(info["index"])
    _check_peers(gpus, seen)


def _check_peers(gpus: list[dict], indexes: set[int]) -> None:
    """An NVLink peer is another GPU of the same register, named by its index."""
    for i, info in enumerate(gpus):
        for j, peer in enumerate(info.get("nvlink_peers") or ()):
            where = f"gpus[{i}].nvlink_peers[{j}]"
            if peer == info["index"]:
                raise ValidationFailed.field(where, "a GPU is not its own NVLink peer")
            if peer not in indexes:
                raise ValidationFailed.field(where, f"no GPU of this node has index {peer}")


def _gpu_retire(gpu: Gpu, now: datetime) -> None:
    if not Allocation.objects.filter(gpu=gpu).exists():
        gpu.delete()  # never booked: nothing to keep (its MIG instances were never booked either)
        return
    Gpu.objects.filter(pk=gpu.pk).update(retired_at=now)
    for mig in gpu.mig_instances.filter(retired_at__isnull=True):
        _mig_retire(mig, now)


def _mig_retire(mig: MigInstance, now: datetime) -> None:
    if Allocation.objects.filter(mig_instance=mig).exists():
        MigInstance.objects.filter(pk=mig.pk).update(retired_at=now)
    else:
        mig.delete()


def _slots_free(node: Node, gpus: list[dict], now: datetime) -> None:
    # Only live GPUs hold a slot (node, index). A reported GPU that moves (two cards swapped,
    # or a card coming from another node) is parked as retired first, so that no update below
    # meets a slot still held by a card that moves away from it later in the loop.
    for info in gpus:
        Gpu.objects.filter(uuid=info["uuid"], retired_at__isnull=True).exclude(
            node=node, index=info["index"]
        ).update(retired_at=now)


def _bookings_settle(gone: list[tuple[Q, str]], now: datetime) -> None:
    """Stop the active bookings and move (or fail) the planned reservations that hold a device
    that is gone, each with the first reason that concerns it."""
    reasons: dict[int, str] = {}
    for where, reason in gone:
        live = Allocation.objects.filter(where, live=True, end__gt=now)
        for booking_id in live.values_list("booking_id", flat=True).distinct():
            # Room in state_detail for what booking_stop or the move adds to it.
            reasons.setdefault(booking_id, reason if len(reason) <= 240 else reason[:239] + "…")
    states = dict(Booking.objects.filter(pk__in=reasons).values_list("pk", "state"))
    for booking_id in sorted(reasons):
        if states.get(booking_id) == Booking.State.ACTIVE:
            booking_stop(
                booking_id=booking_id, to=Booking.State.FAILED, now=now, detail=reasons[booking_id]
            )
        elif states.get(booking_id) == Booking.State.PLANNED:
            reservation_move_off_retired(booking_id=booking_id, now=now, reason=reasons[booking_id])


def node_resources_settle(*, node_id: int, now: datetime) -> None:
    """After a register: if the node now has fewer cores or less memory than its running
    bookings hold (a smaller replacement), stop the newest of them, with the reason, until the
    rest fit (batch jobs requeue, as on a replaced GPU). Called with the node locked."""
    capacity = node_capacities([node_id]).get(node_id)
    if capacity is None:
        return
    held = live_holdings(during=(now, now), capacities={node_id: capacity})
    running = (
        Booking.objects.filter(pk__in=[b for b, _ in held], state=Booking.State.ACTIVE)
        .order_by("started_at", "pk")
        .values_list("pk", flat=True)
    )
    kept = [(pk, held[(pk, node_id)]) for pk in running]
    hostname = Node.objects.filter(pk=node_id).values_list("hostname", flat=True).get()
    while kept and (
        sum(c for _, (c, _) in kept) > capacity.cpus
        or sum(m for _, (_, m) in kept) > capacity.memory_mib
    ):
        booking_id, _ = kept.pop()  # the newest first
        reason = (
            f"{hostname} now has {capacity.cpus} cores and {capacity.memory_mib} MiB of memory, "
            "less than its running bookings held"
        )
        booking_stop(booking_id=booking_id, to=Booking.State.FAILED, now=now, detail=reason)


def gpu_model_name(nvml_name: str) -> str:
    """The model as users type it: NVML's product name without the vendor ("NVIDIA H100 80GB HBM3"
    becomes "H100 80GB HBM3")."""
    name = nvml_name.strip()
    return name[len("NVIDIA ") :] if name.upper().startswith("NVIDIA ") else name


def _gpu_upsert(node: Node, info: dict) -> tuple[Gpu, bool]:
    """The GPU live at the reported slot, and whether it was live and whole before."""
    before = Gpu.objects.filter(uuid=info["uuid"]).values_list("mig_mode", "retired_at").first()
    gpu, _ = Gpu.objects.update_or_create(
        uuid=info["uuid"],
        defaults={
            "node": node,
            "index": info["index"],
            "model": gpu_model_name(info["model"]),
            "memory_mib": info["memory_total_mib"],
            "mig_mode": bool(info.get("mig_mode")),
            "retired_at": None,
            # Topology is the slot's as last reported: a card replaced or moved gets its new one.
            "pci_bus_id": info.get("pci_bus_id") or "",
            "numa_node": info.get("numa_node"),
            "nvlink_peers": sorted(set(info.get("nvlink_peers") or ())),
        },
    )
    return gpu, before is not None and not before[0]


def _placed(migs: list[dict]) -> list[tuple[dict, int]]:
    """Each MIG instance with its first compute slice: where the agent says it is (NVIDIA's
    placement start), else packed in the order the agent lists them."""
    placed, start = [], 0
    for mig in migs:
        at = mig.get("placement_start")
        if at is None or at > MIG_SLICES_PER_GPU - mig["slices"]:
            at = min(start, MIG_SLICES_PER_GPU - mig["slices"])
        placed.append((mig, at))
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
            "retired_at": None,
        },
    )
    return mig


def node_inventory_from_spec(*, hostname: str, spec: str, site: str = "") -> Node:
    """Create a node with the inventory a simulated agent of this SPEC will report (demo, tests).

    `site` is the agent's --site-id (the demo's: portal.services.reporting.demo.demo_site_id): the UUIDs
    derive from it, and a device the agent reports under another UUID would be replaced.
    """
    from agents.protocol import to_json
    from agents.simulate import SimulatedBackend

    node, _ = Node.objects.get_or_create(hostname=hostname)
    backend = SimulatedBackend(spec, hostname=hostname, site=site)
    node_inventory_update(node=node, gpus=[to_json(gpu) for gpu in backend.discover()])
    resources = backend.host()  # the SPEC's cpus= and mem=, as its agent will report them
    if resources is not None:
        Node.objects.filter(pk=node.pk).update(
            cpus=len(resources.cpus), memory_mib=resources.memory_mib
        )
        node.cpus, node.memory_mib = len(resources.cpus), resources.memory_mib
    backend.close()
    return node


# Heartbeats closer together than this are not written again (agents post several times a
# second under load; the heartbeat timeout is a minute).
HEARTBEAT_WRITE_INTERVAL = timedelta(seconds=1)


def node_mark_seen(*, node: Node, agent_version: str = "") -> bool:
    """Record a heartbeat; a node that was down comes back up (True then) and may get work.

    `node` should be freshly read with its last heartbeat (``node_for_token`` annotates
    ``last_seen``): its state and last_seen decide whether anything needs writing. The heartbeat
    goes to the node's NodeHeartbeat row; the node row is written only for a new agent version
    or a node coming back up.
    """
    now = timezone.now()
    last_seen = node_last_seen(node)
    recent = last_seen is not None and now - last_seen < HEARTBEAT_WRITE_INTERVAL
    if recent and node.state != Node.State.DOWN and not agent_version:
        return False
    NodeHeartbeat.objects.bulk_create(
        [NodeHeartbeat(node_id=node.pk, last_seen=now)],
        update_conflicts=True,
        unique_fields=["node"],
        update_fields=["last_seen"],
    )
    if agent_version:
        Node.objects.filter(pk=node.pk).update(agent_version=agent_version)
    if node.state != Node.State.DOWN and not _may_be_going_down(node, last_seen, now):
        return False
    # The write above waited for any node-down scan holding the heartbeat row, so this
    # compare-and-set (a new statement, a new snapshot) sees a down that committed meanwhile: a
    # heartbeat that was recorded never leaves the node down.
    came_up = Node.objects.filter(pk=node.pk, state=Node.State.DOWN).update(
        state=Node.State.UP, state_reason=""
    )
    if came_up:
        events.node_changed(node_id=node.pk, change="up")
    return bool(came_up)


def node_last_seen(node: Node) -> datetime | None:
    """The node's last heartbeat as read with it (annotated ``last_seen``), else read now."""
    if hasattr(node, "last_seen"):
        return node.last_seen
    return NodeHeartbeat.objects.filter(node_id=node.pk).values_list("last_seen", flat=True).first()


def _may_be_going_down(node: Node, last_seen: datetime | None, now: datetime) -> bool:
    """Whether a node-down scan may be marking the node (as read, up) down right now: its last
    heartbeat is old enough for a scan to call it silent (half the timeout: clocks may differ)."""
    if node.state != Node.State.UP:
        return False
    timeout = timedelta(seconds=settings.NODE_HEARTBEAT_TIMEOUT_S)
    return last_seen is None or now - last_seen >= timeout / 2


def nodes_heartbeat_check(*, now: datetime) -> list[str]:
    """Mark up nodes silent for NODE_HEARTBEAT_TIMEOUT_S as down and end their active bookings.

    Each node goes down by compare-and-set (a heartbeat racing in keeps it up). Its active
    bookings fail; batch ones (a command, no fixed window) go back to the queue, keeping their
    submit time, when REQUEUE_ON_NODE_FAILURE. Returns the hostnames marked down.
    """
    cutoff = now - timedelta(seconds=settings.NODE_HEARTBEAT_TIMEOUT_S)
    stale = Node.objects.filter(state=Node.State.UP, heartbeat__last_seen__lt=cutoff)
    return [
        hostname
        for node_id, hostname in stale.values_list("pk", "hostname")
        if _node_down(node_id, hostname, cutoff, now)
    ]


def _node_down(node_id: int, hostname: str, cutoff: datetime, now: datetime) -> bool:
    reason = f"node {hostname} stopped reporting"
    with transaction.atomic(durable=True):
        # The heartbeat row first: a heartbeat that committed meanwhile makes it no longer
        # match (re-checked after the wait), and one that comes later waits for this commit.
        silent = NodeHeartbeat.objects.select_for_update().filter(
            node_id=node_id, last_seen__lt=cutoff
        )
        if not list(silent.values_list("node_id", flat=True)):
            return False
        if not Node.objects.filter(pk=node_id, state=Node.State.UP).update(
            state=Node.State.DOWN, state_reason=f"no heartbeat since {cutoff:%H:%M:%S} UTC"
        ):
            return False
        held = Booking.objects.filter(
            state=Booking.State.ACTIVE, allocations__live=True, allocations__gpu__node_id=node_id
        ).distinct()
        for booking in held:
            _fail_booking(booking, reason, now)
        fact_record(
            kind=events.NODE_DOWN,
            node_id=node_id,
            payload={"hostname": hostname, "reason": reason, "at": now.isoformat()},
            now=now,
        )
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
            events.node_changed(node_id=node.pk, change=action.split(".")[1])
            changed += 1
    return changed
