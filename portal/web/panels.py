"""Reads for the queue page (squeue for the portal) and the staff panel (nodes and open alerts).

Who may see which booking is decided once, by `portal.services.booking.selectors.visible_bookings`.
"""

from dataclasses import dataclass
from datetime import datetime

from django.db.models import Count, F, Q

from portal.models import Booking, Node, NodeAlert
from portal.services.booking.selectors import visible_bookings
from portal.services.inventory import selectors as inventory
from portal.services.inventory.telemetry_cache import latest_by_uuid
from portal.web.selectors import device_labels, pending_reason_text


def queue_rows(*, user) -> list[Booking]:
    """Pending bookings the user may see, in queue order, each with its reason in words."""
    rows = list(
        visible_bookings(user)
        .filter(state=Booking.State.PENDING)
        .select_related("owner", "project")
        .prefetch_related("dependencies")
        .order_by(
            F("queue_position").asc(nulls_last=True),
            F("planned_start").asc(nulls_last=True),
            "submitted_at",
            "id",
        )
    )
    for booking in rows:
        booking.reason_text = pending_reason_text(booking.pending_reason)
    return rows


def queue_length() -> int:
    """Every pending booking, the user's or not: how long the whole queue is."""
    return Booking.objects.filter(state=Booking.State.PENDING).count()


@dataclass(frozen=True)
class NodeLine:
    """A node as the staff panel shows it: state, when it last reported, what it holds."""

    node: Node
    gpus: int
    models: str
    slices: int
    live_bookings: int
    open_alerts: int


@dataclass(frozen=True)
class AlertLine:
    """An agent's objection whose process the device's latest reading still shows."""

    alert: NodeAlert
    device: str


def node_lines(*, alerts: list[AlertLine]) -> list[NodeLine]:
    """Every node, down and draining ones first, with its GPUs and open alerts counted."""
    nodes = Node.objects.annotate(
        gpu_count=Count("gpus", filter=Q(gpus__retired_at__isnull=True), distinct=True),
        live_count=Count(
            "gpus__allocations__booking",
            filter=Q(gpus__allocations__live=True),
            distinct=True,
        ),
    )
    models: dict[int, dict[str, int]] = {}
    for node_id, model in inventory.gpus_live().values_list("node_id", "model"):
        models.setdefault(node_id, {}).setdefault(model, 0)
        models[node_id][model] += 1
    slices = dict(
        inventory.mig_instances_bookable()
        .values("gpu__node_id")
        .annotate(n=Count("id"))
        .values_list("gpu__node_id", "n")
    )
    open_by_node: dict[int, int] = {}
    for line in alerts:
        open_by_node[line.alert.node_id] = open_by_node.get(line.alert.node_id, 0) + 1
    order = {Node.State.DOWN: 0, Node.State.DRAIN: 1, Node.State.MAINTENANCE: 1, Node.State.UP: 2}
    return sorted(
        (
            NodeLine(
                node=n,
                gpus=n.gpu_count,
                models=", ".join(f"{c} × {m}" for m, c in sorted(models.get(n.pk, {}).items())),
                slices=slices.get(n.pk, 0),
                live_bookings=n.live_count,
                open_alerts=open_by_node.get(n.pk, 0),
            )
            for n in nodes
        ),
        key=lambda line: (order.get(line.node.state, 3), line.node.hostname),
    )


def open_alerts(*, since: datetime, limit: int = 200) -> list[AlertLine]:
    """Alerts reported since `since` whose process is still in its device's latest reading,
    last reported first.

    An alert has no closing event of its own: it stays open while the process it names runs.
    """
    alerts = list(
        NodeAlert.objects.filter(last_seen__gte=since)
        .select_related("node", "booking", "owner")
        .order_by("-last_seen", "-id")[:limit]
    )
    readings = latest_by_uuid(sorted({a.device_uuid for a in alerts if a.device_uuid}))
    labels = device_labels({a.device_uuid for a in alerts})
    lines, seen = [], set()
    for alert in alerts:
        running = {
            p.get("pid") for p in (readings.get(alert.device_uuid) or {}).get("processes") or ()
        }
        key = (alert.device_uuid, alert.pid)
        if alert.pid in running and key not in seen:
            seen.add(key)
            lines.append(AlertLine(alert, labels.get(alert.device_uuid, alert.device_uuid)))
    return lines
