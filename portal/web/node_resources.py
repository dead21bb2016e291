"""Cores and host memory on the pages: per node, held now of what it reports, and what one
booking holds on each of its nodes. The figures are services/inventory/resources.py's (the
one reader of scheduler.resources.node_demand's inputs); this only labels them by hostname."""

from dataclasses import dataclass
from datetime import datetime

from portal.models import Allocation, Booking, Node
from portal.services.inventory.resources import held_now_by_node, held_on_nodes, node_capacities


def node_resources(*, now: datetime, hostnames: list[str] | None = None) -> dict[str, tuple]:
    """(cores held now, cores, memory MiB held now, memory MiB) per hostname, for the nodes
    that report cores and memory."""
    nodes = Node.objects.filter(cpus__isnull=False, memory_mib__isnull=False)
    if hostnames is not None:
        nodes = nodes.filter(hostname__in=hostnames)
    hosts = dict(nodes.values_list("pk", "hostname"))
    capacities = node_capacities(hosts)
    held = held_now_by_node(now, hosts)
    return {
        hosts[pk]: (held[pk][0], capacity.cpus, held[pk][1], capacity.memory_mib)
        for pk, capacity in capacities.items()
    }


@dataclass(frozen=True)
class NodeHold:
    """What a booking holds on one node, beside what the node has in use now."""

    hostname: str
    cpus: int
    memory_mib: int
    node: tuple[int, int, int, int]  # as node_resources


def booking_holds(booking: Booking, allocations: list[Allocation], *, now: datetime):
    """What a booking (with these allocations, gpu__node read) holds on each node that reports
    cores and memory: its live allocations, or, once it ended, its last ones; [NodeHold]."""
    if not allocations:
        return []
    latest = max(a.start for a in allocations)
    held = [a for a in allocations if a.live] or [a for a in allocations if a.start == latest]
    hosts = {a.gpu.node_id: a.gpu.node.hostname for a in held}
    rows = [(booking.pk, a.gpu.node_id, a.fraction, booking.cpus, booking.memory_mib) for a in held]
    holdings = held_on_nodes(rows, node_capacities(hosts))
    in_use = node_resources(now=now, hostnames=list(hosts.values()))
    return sorted(
        (
            NodeHold(hosts[node_id], cpus, memory_mib, in_use[hosts[node_id]])
            for (_, node_id), (cpus, memory_mib) in holdings.items()
        ),
        key=lambda hold: hold.hostname,
    )
