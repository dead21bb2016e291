"""The overview's first screen from a small cached summary, and its live patches.

What a person reads first (what is free, by model and by node; the site's totals) comes from one
`Summary`, built from `selectors.device_rows` (the one owner of a device's state) and kept in the
cache. It follows the facts of the outbox: every booking change and node failure records a
`DomainEvent` in its transaction, and after commit its subscriber `overview_fact_patch` recounts
just the nodes the fact touched and folds them, with the queue's size, into the cached summary
(`summary_apply`), so the summary is behind a committed change only by the dispatch (well
under a second). A fact that no subscriber folded in within FACT_GRACE_S (no worker running,
a patch lost to a concurrent rebuild) makes the next open rebuild the whole summary; so does
age (SUMMARY_MAX_AGE_S: what changes without a fact, such as a process appearing on a free GPU
or utilization, shows within that). A rebuild reads the whole site, so it runs at most every
SUMMARY_MIN_AGE_S, in one process at a time while the others serve the summary they have (up
to SUMMARY_STALE_S old, should the rebuild take that long); each process reads the shared
summary at most every SUMMARY_MIN_AGE_S.

A node's devices are rendered only when asked for (`?fragment=node&node=<hostname>`, when the
node is expanded), except on a small site, whose nodes open with their devices.

The same subscriber sends open pages the patch over the websocket: the new counts of the nodes
the booking touches, the new state of their devices and the queue's size. Pages apply it in
place and sum their node lines for the totals.
"""

import json
import logging
import threading
import time
from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from django.core.cache import cache
from django.db import connection
from django.db.models import Max
from django.utils import timezone

from portal.models import Allocation, Booking, DomainEvent, Node
from portal.services.core.clock import to_epoch
from portal.services.realtime import live
from portal.web import selectors
from portal.web.node_resources import node_resources
from portal.web.selectors import DeviceRow, Totals

log = logging.getLogger(__name__)

SUMMARY_KEY = "overview:summary:v1"
BUILD_LOCK_KEY = "overview:summary:building"
PATCH_LOCK_KEY = "overview:summary:patching"
SUMMARY_TTL_S = 120
# A fact's subscriber folds it into the summary; one it has not folded in after FACT_GRACE_S
# makes the next open rebuild the summary.
FACT_GRACE_S = 1.0
# What changes without a fact (a process on a free GPU, utilization) shows within this.
SUMMARY_MAX_AGE_S = 10.0
SUMMARY_MIN_AGE_S = 0.5
SUMMARY_STALE_S = 15.0
# A site with at most this many devices opens every node with its devices shown.
INLINE_DEVICES = 64
PATCH_TYPE = "overview.patch"


@dataclass(frozen=True)
class NodeLine:
    """One node as the overview lists it: state, and per model its GPUs and MIG slices."""

    hostname: str
    state: str
    # model -> (GPUs not in MIG mode, free ones, bookable MIG slices, free ones)
    counts: dict[str, tuple[int, int, int, int]]
    states: frozenset[str]  # the device states present, for the state filter
    # (cores held now, cores, memory MiB held now, memory MiB); None: the node reports none.
    resources: tuple[int, int, int, int] | None = None

    def _sum(self, i: int) -> int:
        return sum(c[i] for c in self.counts.values())

    gpus = property(lambda self: self._sum(0))
    free_gpus = property(lambda self: self._sum(1))
    slices = property(lambda self: self._sum(2))
    free_slices = property(lambda self: self._sum(3))

    @property
    def models(self) -> str:
        return ", ".join(sorted(self.counts))

    @property
    def counts_json(self) -> str:
        return json.dumps(self.counts, sort_keys=True)

    @property
    def resources_json(self) -> str:
        return json.dumps(self.resources)

    def patch(self) -> dict:
        return {
            "hostname": self.hostname,
            "state": self.state,
            "counts": self.counts,
            "states": sorted(self.states),
            "resources": self.resources,
        }


@dataclass(frozen=True)
class ModelLine:
    """What is free of one GPU model across the site."""

    model: str
    gpus: int
    free_gpus: int
    slices: int
    free_slices: int


@dataclass(frozen=True)
class Summary:
    """The first screen of the overview, as of `version` (the newest fact) and `built_at`."""

    version: int
    built_at: float
    nodes: tuple[NodeLine, ...]
    models: tuple[ModelLine, ...]
    totals: Totals
    devices: int


def facts_version() -> int:
    """The id of the newest fact: it moves whenever a booking or node change commits."""
    return DomainEvent.objects.aggregate(newest=Max("id"))["newest"] or 0


def node_lines(
    rows: list[DeviceRow], nodes: dict[str, str], resources: dict[str, tuple] | None = None
) -> list[NodeLine]:
    """Count `rows` (from device_rows) per node; `nodes` maps each hostname to its state, so a
    node without devices is listed too; `resources` (node_resources) its cores and memory."""
    resources = resources or {}
    counts: dict[str, dict[str, list[int]]] = {host: {} for host in nodes}
    states: dict[str, set[str]] = {host: set() for host in nodes}
    for row in rows:
        line = counts.setdefault(row.node, {}).setdefault(row.model, [0, 0, 0, 0])
        if row.children:
            line[2] += len(row.children)
            line[3] += sum(1 for c in row.children if c.state == "free")
        else:
            line[0] += 1
            line[1] += row.state == "free"
        states.setdefault(row.node, set()).update([row.state, *(c.state for c in row.children)])
    return [
        NodeLine(
            hostname=host,
            state=nodes.get(host, Node.State.UP),
            counts={model: tuple(c) for model, c in sorted(counts[host].items())},
            states=frozenset(states[host]),
            resources=resources.get(host),
        )
        for host in sorted(counts)
    ]


def model_lines(nodes: list[NodeLine]) -> list[ModelLine]:
    """The node lines summed per model."""
    sums: dict[str, list[int]] = {}
    for node in nodes:
        for model, counts in node.counts.items():
            total = sums.setdefault(model, [0, 0, 0, 0])
            for i, n in enumerate(counts):
                total[i] += n
    return [ModelLine(model, *total) for model, total in sorted(sums.items())]


def summary_build(*, now: datetime, version: int) -> tuple[Summary, list[DeviceRow]]:
    """Read the whole site once and count it; also returns the device rows it counted."""
    rows = selectors.device_rows(now=now)
    states = dict(Node.objects.values_list("hostname", "state"))
    nodes = node_lines(rows, states, node_resources(now=now))
    summary = Summary(
        version=version,
        built_at=to_epoch(now),
        nodes=tuple(nodes),
        models=tuple(model_lines(nodes)),
        totals=selectors.site_totals(rows=rows, now=now),
        devices=len(rows) + sum(len(r.children) for r in rows),
    )
    return summary, rows


# This process's last summary and when it was checked against the newest fact: for
# SUMMARY_MIN_AGE_S it is served without asking the database or the cache.
_checked: tuple[Summary, float] | None = None


def summary_forget(*, shared: bool = True) -> None:
    """Drop this process's summary and (`shared`) the cached one (tests: the next read builds
    one, or reads the cached one)."""
    global _checked
    _checked = None
    if shared:
        cache.delete(SUMMARY_KEY)


def overview_summary(*, now: datetime) -> tuple[Summary, list[DeviceRow] | None]:
    """The summary this process checked less than SUMMARY_MIN_AGE_S ago, or the cached one if
    no fact is newer and it is young enough, else a new one (with the device rows it was built
    from, which the caller may reuse)."""
    global _checked
    checked = _checked
    if checked and 0 <= to_epoch(now) - checked[1] < SUMMARY_MIN_AGE_S:
        return checked[0], None
    summary, rows = _summary_checked(now)
    _checked = (summary, to_epoch(now))
    return summary, rows


def _summary_checked(now: datetime) -> tuple[Summary, list[DeviceRow] | None]:
    cached = cache.get(SUMMARY_KEY)
    age = to_epoch(now) - cached.built_at if cached else None
    # Asked every time (one indexed query), so that a read costs the same whatever the age.
    unapplied = cached is not None and _facts_unapplied(cached.version, now)
    if cached and (age < SUMMARY_MIN_AGE_S or (age < SUMMARY_MAX_AGE_S and not unapplied)):
        return cached, None
    # One process rebuilds; the others serve the summary they have meanwhile, unless it is
    # older than SUMMARY_STALE_S (the one rebuilding died, or it takes too long). The one
    # rebuilding does it off the request, serving the old one too, unless the request is in a
    # transaction (which must see its own writes: tests, commands).
    building = cache.add(BUILD_LOCK_KEY, 1, timeout=30)
    if cached and age < SUMMARY_STALE_S:
        if not building:
            return cached, None
        if not connection.in_atomic_block:
            threading.Thread(target=_rebuild, name="overview-summary", daemon=True).start()
            return cached, None
    elif not building and not connection.in_atomic_block:
        waited = _summary_awaited()  # none yet (a cold start): wait for the one being built
        if waited is not None:
            return waited, None
    try:
        summary, rows = summary_build(now=now, version=facts_version())
        cache.set(SUMMARY_KEY, summary, timeout=SUMMARY_TTL_S)
    finally:
        if building:
            cache.delete(BUILD_LOCK_KEY)
    return summary, rows


def _summary_awaited(timeout_s: float = 10.0) -> Summary | None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and cache.get(BUILD_LOCK_KEY) is not None:
        time.sleep(0.05)
        summary = cache.get(SUMMARY_KEY)
        if summary is not None:
            return summary
    return cache.get(SUMMARY_KEY)


def _rebuild() -> None:
    """Build the summary in a thread of its own (holding the build lock), then let go."""
    try:
        summary, _ = summary_build(now=timezone.now(), version=facts_version())
        cache.set(SUMMARY_KEY, summary, timeout=SUMMARY_TTL_S)
    except Exception:  # the next open tries again; the old summary is served meanwhile
        log.exception("overview summary rebuild failed")
    finally:
        cache.delete(BUILD_LOCK_KEY)
        connection.close()


def _facts_unapplied(version: int, now: datetime) -> bool:
    """Is there a fact newer than the summary that its subscriber (overview_fact_patch) had
    FACT_GRACE_S to fold in and did not (no worker running, a patch lost to a rebuild)?"""
    since = now - timedelta(seconds=FACT_GRACE_S)
    return DomainEvent.objects.filter(id__gt=version, created_at__lt=since).exists()


def summary_apply(message: dict) -> bool:
    """Fold a patch (patch_build) into the cached summary: its node lines and the queue's size.
    Under a short lock, so two patches do not lose each other; False if it was not folded."""
    for _ in range(20):
        if cache.add(PATCH_LOCK_KEY, 1, timeout=2):
            break
        time.sleep(0.005)
    else:
        return False
    try:
        cached = cache.get(SUMMARY_KEY)
        if cached is None:
            return False
        lines = {line.hostname: line for line in cached.nodes}
        for node in message["nodes"]:
            lines[node["hostname"]] = NodeLine(
                hostname=node["hostname"],
                state=node["state"],
                counts={model: tuple(c) for model, c in node["counts"].items()},
                states=frozenset(node["states"]),
                resources=tuple(node["resources"]) if node.get("resources") else None,
            )
        nodes = [lines[host] for host in sorted(lines)]
        totals = replace(
            cached.totals,
            free_gpus=sum(line.free_gpus for line in nodes),
            whole_gpus=sum(line.gpus for line in nodes),
            free_slices=sum(line.free_slices for line in nodes),
            slices=sum(line.slices for line in nodes),
            queued=message["queued"],
            queued_gpu_hours=message["queued_gpu_hours"],
        )
        summary = replace(
            cached,
            version=max(cached.version, message["version"]),
            nodes=tuple(nodes),
            models=tuple(model_lines(nodes)),
            totals=totals,
        )
        cache.set(SUMMARY_KEY, summary, timeout=SUMMARY_TTL_S)
        return True
    finally:
        cache.delete(PATCH_LOCK_KEY)


def summary_choices(summary: Summary) -> dict:
    """What the overview's filters offer (as selectors.filter_choices, without a query)."""
    return {
        "models": [line.model for line in summary.models],
        "nodes": [line.hostname for line in summary.nodes],
        "states": list(selectors.FILTER_STATES),
    }


def shown_nodes(summary: Summary, *, model="", node="", state="") -> list[tuple[NodeLine, bool]]:
    """(line, matches the filters) for every node: pages keep all lines to sum the totals."""
    return [
        (
            line,
            (not model or model in line.counts)
            and (not node or line.hostname == node)
            and (not state or state in line.states),
        )
        for line in summary.nodes
    ]


def expanded_nodes(summary: Summary, *, node="") -> list[str]:
    """The nodes that open with their devices: the one filtered for, or all on a small site."""
    if node:
        return [node]
    if summary.devices <= INLINE_DEVICES:
        return [line.hostname for line in summary.nodes]
    return []


def node_device_rows(
    *, now: datetime, hostnames: list[str], rows: list[DeviceRow] | None = None, **filters
) -> dict[str, list]:
    """Device rows of some nodes (read, or picked from the site's `rows`), filtered as the
    overview is, per hostname."""
    if not hostnames:
        return {}
    if rows is None:
        rows = selectors.device_rows(now=now, hostnames=hostnames)
    by_node: dict[str, list] = {host: [] for host in hostnames}
    for row in selectors.filter_rows(rows, **filters):
        if row.node in by_node:
            by_node[row.node].append(row)
    return by_node


def node_detail(*, now: datetime, hostname: str, **filters) -> tuple[NodeLine, list] | None:
    """One node's line counted now (not from the summary) and its device rows, filtered; None
    for a node that does not exist."""
    states = dict(Node.objects.filter(hostname=hostname).values_list("hostname", "state"))
    if not states:
        return None
    rows = selectors.device_rows(now=now, hostnames=[hostname])
    [line] = node_lines(rows, states, node_resources(now=now, hostnames=[hostname]))
    return line, selectors.filter_rows(rows, **filters)


# The live patch -------------------------------------------------------------------------------


def overview_fact_patch(fact) -> None:
    """Subscriber: send open pages the new counts and device states of what a fact touched."""
    hostnames = _fact_nodes(fact)
    owner_id = None
    if fact.booking_id is not None:
        owner_id = Booking.objects.filter(pk=fact.booking_id).values_list("owner_id", flat=True)
        owner_id = owner_id.first()
    message = patch_build(hostnames=hostnames, owner_id=owner_id)
    summary_apply(message)
    live.group_send(live.QUEUE_GROUP, message)


def _fact_nodes(fact) -> list[str]:
    hosts = set()
    if fact.booking_id is not None:
        hosts.update(
            Allocation.objects.filter(booking_id=fact.booking_id).values_list(
                "gpu__node__hostname", flat=True
            )
        )
    if fact.node_id is not None:
        hosts.update(Node.objects.filter(pk=fact.node_id).values_list("hostname", flat=True))
    return sorted(hosts)


def patch_build(*, hostnames: list[str], owner_id: int | None, now=None) -> dict:
    """The message: node lines and device states of `hostnames`, and the queue's size now."""
    now = now or timezone.now()
    version = facts_version()
    rows = selectors.device_rows(now=now, hostnames=hostnames) if hostnames else []
    states = dict(Node.objects.filter(hostname__in=hostnames).values_list("hostname", "state"))
    queued, queued_hours = selectors.queue_demand()
    return {
        "type": PATCH_TYPE,
        "version": version,
        "owner_id": owner_id,
        "nodes": [
            line.patch()
            for line in node_lines(
                rows, states, node_resources(now=now, hostnames=hostnames) if hostnames else {}
            )
        ],
        "devices": [_device_patch(r) for row in rows for r in (row, *row.children)],
        "queued": queued,
        "queued_gpu_hours": queued_hours,
    }


def _device_patch(row: DeviceRow) -> dict:
    booking = row.booking
    return {
        "uuid": row.uuid,
        "state": row.state,
        "state_label": row.state_label,
        "booking": None
        if booking is None
        else {
            "id": booking.pk,
            "owner": booking.owner.username,
            "owner_id": booking.owner_id,
            "project": booking.project.slug,
        },
        # A shared GPU's bookings now, each with its share (web.tenants).
        "tenants": [
            {
                "id": t.booking.pk,
                "owner": t.booking.owner.username,
                "owner_id": t.booking.owner_id,
                "percent": t.percent,
                "memory_mib": t.memory_mib,
                "used_mib": t.used_mib,
            }
            for t in row.tenants
        ],
    }
