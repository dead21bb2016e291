"""Which nodes a maintenance window covers, and the windows as the allocator's inputs."""

from datetime import datetime

from django.db.models import Q

import scheduler.types
from portal.models import Gpu, MaintenanceWindow, Node
from portal.services.core.clock import to_epoch
from scheduler.reserve import Hold


def window_nodes(window: MaintenanceWindow) -> list[Node]:
    """The nodes a window covers now: those named, those of its group, or every node."""
    named = list(window.nodes.all())  # prefetched by the lists
    if not window.network_group:
        if named:
            return sorted(named, key=lambda node: node.hostname)
        return list(Node.objects.order_by("hostname"))
    covered = Q(pk__in=[node.pk for node in named])
    if window.network_group:
        covered |= Q(network_group=window.network_group)
    return list(Node.objects.filter(covered).order_by("hostname"))


def maintenance_windows_planned(*, now: datetime) -> tuple:
    """The windows not yet over, as the allocator's inputs (``scheduler.types.Window``)."""
    windows = list(
        MaintenanceWindow.objects.filter(end__gt=now).prefetch_related("nodes").order_by("pk")
    )
    if not windows:
        return ()
    everyone = None
    groups: dict[str, list[str]] = {}
    for hostname, group in Node.objects.values_list("hostname", "network_group"):
        groups.setdefault(group, []).append(hostname)
    out = []
    for window in windows:
        names = {node.hostname for node in window.nodes.all()}
        if window.network_group:
            names.update(groups.get(window.network_group, ()))
        elif not names:
            everyone = everyone or {h for hosts in groups.values() for h in hosts}
            names = everyone
        out.append(
            scheduler.types.Window(
                id=str(window.pk),
                reason=window.reason,
                start=to_epoch(window.start),
                end=to_epoch(window.end),
                nodes=tuple(sorted(names)),
            )
        )
    return tuple(out)


def window_holds(*, gpu_ids, start: datetime, end: datetime) -> tuple[Hold, ...]:
    """The maintenance windows overlapping [start, end) as holds of the whole of each of these
    GPUs (ids, or a queryset of them) on their nodes: an advance reservation is placed around
    them like around any allocation, and the next window it may have starts at their end."""
    windows = MaintenanceWindow.objects.filter(start__lt=end, end__gt=start).order_by("pk")
    holds = []
    for window in windows.prefetch_related("nodes"):
        nodes = [node.pk for node in window_nodes(window)]
        gpus = Gpu.objects.filter(node_id__in=nodes, id__in=gpu_ids).values_list("pk", flat=True)
        span = to_epoch(window.start), to_epoch(window.end)
        holds += [Hold(gpu, None, *span) for gpu in gpus]
    return tuple(holds)


def window_in_the_way(*, gpu_ids, start: datetime, end: datetime) -> MaintenanceWindow | None:
    """The earliest maintenance window over [start, end) on the nodes of these GPUs (an
    extension that would run into it is refused), or None."""
    windows = MaintenanceWindow.objects.filter(start__lt=end, end__gt=start).order_by("start", "id")
    windows = list(windows.prefetch_related("nodes"))
    if not windows:
        return None  # one query where no window is near (the start path asks at every start)
    nodes = set(Gpu.objects.filter(id__in=gpu_ids).values_list("node_id", flat=True))
    for window in windows:
        if nodes & {node.pk for node in window_nodes(window)}:
            return window
    return None
