"""A booking's processes on its nodes: rendezvous ports, per-node runs, and the gang rule.

A booking across N nodes runs one process per node (docs/distributed.md). Each node's start,
output and exit is a NodeRun of the booking's current run (Booking.restart_count). The gang
rule: the first node whose process fails ends the booking failed, naming the node, its rank
and exit code; the others then lose the booking from their desired state and stop it (SIGTERM,
SIGKILL JOB_KILL_WAIT_S later). The booking finishes when every node's process exited 0.
A booking on one node keeps the single-process rules of fleet.agents.
"""

import logging
from datetime import datetime

from django.conf import settings
from django.db import transaction

from agents.protocol import DesiredState, Event
from portal.models import Booking, NodeRun
from portal.services.core.locking import lock_nodes
from portal.services.fleet.selectors import BookingNode, agent_desired, booking_node_places

log = logging.getLogger(__name__)

State = Booking.State


def agent_desired_dispatch(*, node_id: int) -> DesiredState:
    """The node's desired state, after giving each multi-node booking on it its port (once).

    Every path that hands desired state to an agent (its pull, the push) comes through here, so
    no rank ever sees a multi-node booking without the port its rank 0 listens on.
    """
    waiting = list(
        _running_on(node_id)
        .filter(master_port__isnull=True)
        .exclude(command="")
        .distinct()
        .order_by("pk")
        .values_list("pk", flat=True)
    )
    if waiting:
        for booking_id, nodes in booking_node_places(booking_ids=waiting).items():
            if len(nodes) > 1:
                _master_port_assign(booking_id, nodes[0].node_id)
    return agent_desired(node_id=node_id)


def _master_port_assign(booking_id: int, rank0_node_id: int) -> None:
    # The lowest port of JOB_MASTER_PORTS no other running booking on rank 0's node holds; the
    # node's row lock makes two bookings' choices one after the other.
    low, high = settings.JOB_MASTER_PORTS
    with transaction.atomic():
        lock_nodes([rank0_node_id])
        taken = set(
            _running_on(rank0_node_id)
            .filter(master_port__isnull=False)
            .values_list("master_port", flat=True)
        )
        port = next((p for p in range(low, high + 1) if p not in taken), None)
        if port is None:
            log.warning("booking %s: every port of JOB_MASTER_PORTS is in use", booking_id)
            return
        Booking.objects.filter(pk=booking_id, master_port__isnull=True).update(master_port=port)


def _running_on(node_id: int):
    return Booking.objects.filter(
        state=State.ACTIVE, allocations__live=True, allocations__gpu__node_id=node_id
    )


def node_run_started(*, booking_id: int, node_id: int, when: datetime) -> None:
    """A node launched its process of a running booking: its run is running."""
    booking = Booking.objects.filter(pk=booking_id, state=State.ACTIVE).first()
    if booking is None:
        return  # requeued or ended meanwhile: the old run's news is stale
    rank = _rank(booking_node_places(booking_ids=[booking_id])[booking_id], node_id)
    NodeRun.objects.update_or_create(
        booking=booking,
        restart=booking.restart_count,
        node_id=node_id,
        defaults={"rank": rank, "state": NodeRun.State.RUNNING},
    )


def node_run_output(*, booking_id: int, node_id: int, log_tail: str) -> None:
    """A running node's latest output, on its run."""
    NodeRun.objects.filter(
        booking_id=booking_id,
        node_id=node_id,
        restart=Booking.objects.filter(pk=booking_id).values("restart_count")[:1],
    ).update(log_tail=log_tail)


def node_run_end(*, booking: Booking, node_id: int, event: Event, when: datetime) -> NodeRun:
    """Record how a node's process of `booking`'s current run ended (exited or stopped)."""
    nodes = booking_node_places(booking_ids=[booking.pk])[booking.pk]
    run, _ = NodeRun.objects.get_or_create(
        booking=booking,
        restart=booking.restart_count,
        node_id=node_id,
        defaults={"rank": _rank(nodes, node_id)},
    )
    run.state = NodeRun.State.EXITED if event.kind == "exited" else NodeRun.State.STOPPED
    run.exit_code = event.exit_code
    run.log_tail = event.log_tail if event.log_tail is not None else run.log_tail
    run.detail, run.ended_at = event.detail[:300], when
    run.save(update_fields=["state", "exit_code", "log_tail", "detail", "ended_at"])
    return run


def booking_is_multi_node(booking: Booking) -> bool:
    """Whether the booking's current run has processes on more than one node."""
    live = booking_node_places(booking_ids=[booking.pk])[booking.pk]
    return (
        len(live) > 1
        or NodeRun.objects.filter(booking=booking, restart=booking.restart_count).count() > 1
    )


def gang_outcome(booking: Booking, run: NodeRun) -> tuple[str, str, str] | None:
    """(state, fact, detail) a multi-node booking moves to after `run` exited, or None: wait.

    The first failure decides; success needs every node's process to have exited 0.
    """
    where = f"node {run.node.hostname} (rank {run.rank})"
    if run.exit_code not in (0, None) or run.detail.startswith("not launched"):
        said = f"exited with code {run.exit_code}" if run.exit_code is not None else run.detail
        if run.detail.startswith("killed by its memory limit"):  # protocol.oom_reason
            said = f"was {run.detail}"
        return State.FAILED, "failed", f"{where} {said}; the other nodes were stopped"
    nodes = booking_node_places(booking_ids=[booking.pk])[booking.pk]
    done = (
        NodeRun.objects.filter(
            booking=booking, restart=booking.restart_count, state=NodeRun.State.EXITED
        )
        .exclude(exit_code__gt=0)
        .exclude(exit_code__lt=0)
    )
    if {n.node_id for n in nodes} <= set(done.values_list("node_id", flat=True)):
        return State.FINISHED, "finished", f"all {len(nodes)} nodes exited with code 0"
    return None


def _rank(nodes: list[BookingNode], node_id: int) -> int:
    return next((node.rank for node in nodes if node.node_id == node_id), 0)
