"""Maintenance windows as the pages show them: the overview, a node's devices, a GPU's page."""

from dataclasses import dataclass
from datetime import datetime

from portal.models import MaintenanceWindow
from portal.services.inventory.windows import window_nodes

# The pages list this many windows; the API and the admin have the rest.
SHOWN = 10


@dataclass(frozen=True)
class WindowLine:
    """One window planned or under way, in words."""

    id: int
    reason: str
    start: datetime
    end: datetime
    nodes: str
    under_way: bool


def windows_shown(*, now: datetime, hostname: str = "") -> list[WindowLine]:
    """Windows not over, soonest first; with ``hostname`` only those covering that node."""
    lines = []
    windows = MaintenanceWindow.objects.filter(end__gt=now).order_by("start", "id")
    for window in windows.prefetch_related("nodes"):
        names = [node.hostname for node in window_nodes(window)]
        if hostname and hostname not in names:
            continue
        every = not window.network_group and not window.nodes.all()
        text = "every node" if every else ", ".join(names) or "no node yet"
        lines.append(
            WindowLine(
                window.pk, window.reason, window.start, window.end, text, window.start <= now
            )
        )
        if len(lines) >= SHOWN:
            break
    return lines
