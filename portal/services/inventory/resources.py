"""CPU cores and host memory each booking holds on each node (docs/scheduling.md, "Cores and
memory"): the inputs scheduler.resources.node_demand needs, read from the database in one place,
for every portal path that asks (the snapshot, the agents' limits, the nodes API, the pages,
accounting, /metrics). The rule itself is node_demand's."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Hashable, Iterable
from datetime import datetime

from django.conf import settings
from django.db.models import Count, Max, Min, Q

import scheduler
import scheduler.reserve
from portal.models import Allocation, Node
from portal.services.core.clock import to_epoch
from portal.services.core.policy import scheduler_policy


def node_capacities(node_ids: Iterable[int] | None = None) -> dict[int, scheduler.NodeResources]:
    """Cores, memory and whole live GPUs of each node whose agent reported cores and memory
    (a node that reported none counts neither), by node id; none while the site does not book
    cores and memory (SCHEDULE_CORES_MEMORY off), so every path counts GPUs alone."""
    if not settings.SCHEDULE_CORES_MEMORY:
        return {}
    nodes = Node.objects.filter(cpus__isnull=False, memory_mib__isnull=False)
    if node_ids is not None:
        nodes = nodes.filter(pk__in=list(node_ids))
    rows = nodes.annotate(
        live_gpus=Count("gpus", filter=Q(gpus__retired_at__isnull=True))
    ).values_list("pk", "cpus", "memory_mib", "live_gpus")
    return {pk: scheduler.NodeResources(cpus, memory, gpus) for pk, cpus, memory, gpus in rows}


def held_on_nodes(
    rows: Iterable[tuple[Hashable, int, float, int | None, int | None]],
    capacities: dict[int, scheduler.NodeResources],
    policy: scheduler.Policy | None = None,
) -> dict[tuple[Hashable, int], tuple[int, int]]:
    """(cores, memory MiB) by (booking id, node id), from allocation rows (booking id, node id,
    GPU-equivalents of the device, the booking's cpus, its memory_mib); nodes without
    capacities are left out. History may key a booking's rows by (booking id, start) instead,
    so that what it held once and what it holds after a requeue are not added together."""
    policy = policy or scheduler_policy()
    equivalents: dict[tuple[Hashable, int], float] = defaultdict(float)
    asked: dict[Hashable, tuple[int | None, int | None]] = {}
    for booking_id, node_id, fraction, cpus, memory_mib in rows:
        if node_id in capacities:
            equivalents[(booking_id, node_id)] += fraction
            asked[booking_id] = (cpus, memory_mib)
    return {
        (booking_id, node_id): scheduler.node_demand(
            *asked[booking_id], amount, capacities[node_id], policy
        )
        for (booking_id, node_id), amount in equivalents.items()
    }


def live_holdings(
    node_ids: Iterable[int] | None = None,
    *,
    during: tuple[datetime, datetime] | None = None,
    capacities: dict[int, scheduler.NodeResources] | None = None,
) -> dict[tuple[int, int], tuple[int, int]]:
    """What every live allocation holds, by (booking id, node id) (``held_on_nodes``); with
    ``during`` (start, end) only the allocations overlapping that window."""
    if capacities is None:
        capacities = node_capacities(node_ids)
    live = Allocation.objects.filter(live=True, gpu__node_id__in=list(capacities))
    if during is not None:
        live = live.filter(start__lt=during[1], end__gt=during[0])
    rows = live.values_list(
        "booking_id", "gpu__node_id", "fraction", "booking__cpus", "booking__memory_mib"
    )
    return held_on_nodes(rows, capacities)


def held_now_by_node(
    now: datetime, node_ids: Iterable[int] | None = None
) -> dict[int, tuple[int, int]]:
    """(cores, memory MiB) held at ``now`` by live allocations, summed per node, for every
    node with capacities (0, 0 where nothing is held): the nodes API, the pages, /metrics."""
    capacities = node_capacities(node_ids)
    rows = Allocation.objects.filter(
        live=True, start__lte=now, end__gt=now, gpu__node_id__in=list(capacities)
    ).values_list("booking_id", "gpu__node_id", "fraction", "booking__cpus", "booking__memory_mib")
    totals = dict.fromkeys(capacities, (0, 0))
    for (_, node_id), (cpus, memory_mib) in held_on_nodes(rows, capacities).items():
        held_cpus, held_memory = totals[node_id]
        totals[node_id] = (held_cpus + cpus, held_memory + memory_mib)
    return totals


def held_by_allocation(
    rows: Iterable[tuple[int, Hashable, int, float, int | None, int | None]],
    capacities: dict[int, scheduler.NodeResources],
    policy: scheduler.Policy | None = None,
) -> dict[int, tuple[float, float]]:
    """(cores, memory MiB) each allocation holds, from rows (allocation id, booking key, node
    id, GPU-equivalents, the booking's cpus, its memory_mib): what its booking holds on its
    node (``held_on_nodes``) split among its devices there by GPU-equivalents. Accounting and
    fair share, which read allocations one by one; allocations on nodes without capacities
    are left out."""
    rows = [row for row in rows if row[2] in capacities]
    held = held_on_nodes((row[1:] for row in rows), capacities, policy)
    equivalents: dict[tuple[Hashable, int], float] = defaultdict(float)
    for _, key, node_id, fraction, _, _ in rows:
        equivalents[(key, node_id)] += fraction
    shares = {}
    for pk, key, node_id, fraction, _, _ in rows:
        cpus, memory_mib = held[(key, node_id)]
        part = fraction / equivalents[(key, node_id)] if equivalents[(key, node_id)] else 0.0
        shares[pk] = (cpus * part, memory_mib * part)
    return shares


def held_by_booking(
    rows: Iterable[tuple[int, int, str, float, int | None, int | None, bool]],
) -> dict[int, list[dict]]:
    """What bookings hold on each node, as the API shows it ([{node, cpus, memory_mib}] by
    node name), from their live allocation rows (booking id, node id, node name,
    GPU-equivalents, the booking's cpus, its memory_mib, whether the node reports cores): one
    query for those nodes' capacities, none when no node reports cores."""
    rows = [row for row in rows if row[6]]
    if not rows:
        return {}
    names = {row[1]: row[2] for row in rows}
    held = held_on_nodes(((row[0], row[1], *row[3:6]) for row in rows), node_capacities(names))
    out: dict[int, list[dict]] = defaultdict(list)
    for (booking_id, node_id), (cpus, memory_mib) in sorted(
        held.items(), key=lambda item: (item[0][0], names[item[0][1]])
    ):
        out[booking_id].append({"node": names[node_id], "cpus": cpus, "memory_mib": memory_mib})
    return out


def host_demand(
    *, asked: tuple[int | None, int | None], devices: Iterable[tuple[int, float]]
) -> tuple[int, int] | None:
    """(cores, memory MiB) a booking asking ``asked`` (cpus, memory_mib) holds in all on these
    devices ((node id, GPU-equivalents) each), by ``held_on_nodes``: what its quota's limits of
    cores and memory count; None where no node of them reports cores."""
    devices = list(devices)
    capacities = node_capacities({node_id for node_id, _ in devices})
    if not capacities:
        return None
    held = held_on_nodes(((0, node_id, amount, *asked) for node_id, amount in devices), capacities)
    return scheduler.total_demand(held.values())


def window_hosts(
    start: datetime,
    end: datetime,
    node_ids: Iterable[int] | None = None,
    *,
    exclude_booking: int | None = None,
    policy: scheduler.Policy | None = None,
) -> scheduler.reserve.Hosts | None:
    """The cores and memory of these nodes (None: all) and what each live booking (but
    ``exclude_booking``) holds of them over [start, end) (``held_on_nodes``, each over its
    allocations' span), as a reservation's placement takes them (``scheduler.reserve.Hosts``);
    None while the site counts GPUs alone."""
    capacities = node_capacities(node_ids)
    if not capacities:
        return None
    held = live_holdings(during=(start, end), capacities=capacities)
    held = {key: value for key, value in held.items() if key[0] != exclude_booking}
    windows = _windows({booking_id for booking_id, _ in held}, (start, end))
    holds = tuple(
        scheduler.reserve.HostHold(
            node_id, to_epoch(windows[booking_id][0]), to_epoch(windows[booking_id][1]), *value
        )
        for (booking_id, node_id), value in held.items()
    )
    return scheduler.reserve.Hosts(capacities, holds, policy or scheduler_policy())


def _windows(booking_ids: set[int], during: tuple[datetime, datetime]) -> dict[int, tuple]:
    """Each booking's (start, end) over its live allocations overlapping ``during``."""
    rows = (
        Allocation.objects.filter(
            live=True, booking_id__in=booking_ids, start__lt=during[1], end__gt=during[0]
        )
        .values("booking_id")
        .annotate(first=Min("start"), last=Max("end"))
        .values_list("booking_id", "first", "last")
    )
    return {booking_id: (first, last) for booking_id, first, last in rows}


def resources_fit(
    *,
    booking_id: int,
    asked: tuple[int | None, int | None],
    devices: Iterable[tuple[int, float]],
    during: tuple[datetime, datetime],
    policy: scheduler.Policy,
) -> bool:
    """Whether a booking asking ``asked`` (cpus, memory_mib) on these devices ((node id,
    GPU-equivalents) each) fits beside what the other allocations over ``during`` hold on
    their nodes: the re-check under the node locks of a start (pass_start), a reservation and
    an extension, by the placement's own rule (``scheduler.reserve.Hosts``)."""
    equivalents: dict[int, float] = defaultdict(float)
    for node_id, amount in devices:
        equivalents[node_id] += amount
    hosts = window_hosts(*during, equivalents, exclude_booking=booking_id, policy=policy)
    if hosts is None:
        return True
    wanted = scheduler.reserve.Wanted(
        0, to_epoch(during[0]), to_epoch(during[1]), cpus=asked[0], memory_mib=asked[1]
    )
    room = hosts.room(wanted)
    return all(room.fits(node_id, amount) for node_id, amount in equivalents.items())
