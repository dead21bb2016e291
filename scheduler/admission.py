"""Submission-time check the portal may use to refuse bookings that could never run."""

from __future__ import annotations

from scheduler.placement import build_nodes, fits_window, is_multi_node
from scheduler.priority import profile_fractions, request_size
from scheduler.quota import quota_refusal
from scheduler.timeline import NodeTimeline
from scheduler.types import Device, Quota, Request


def never_fits(
    request: Request, devices: tuple[Device, ...], quota: Quota | None = None
) -> str | None:
    """Why ``request`` could never run on ``devices`` under ``quota`` (None: it could).

    Node state is ignored (a down node may come back); only the inventory and the limits count.
    """
    if request.gpus <= 0 or request.duration_s <= 0:
        return "a booking needs at least one GPU and a positive duration"
    nodes = build_nodes(devices, 0.0)
    multi = is_multi_node(request, nodes)
    empty = [NodeTimeline(0.0, node.full) for node in nodes]
    if not fits_window(nodes, empty, request, multi, 0.0, 0.0):
        return _inventory_reason(request)
    size = request_size(request, profile_fractions(devices))
    hours = size * request.duration_s / 3600.0
    refusal = quota_refusal(quota, gpus=size, gpu_hours=hours) if quota is not None else None
    if refusal is None:
        return None
    if refusal.limit == "max_gpus":
        return f"asks {size:g} GPUs at once, the limit is {refusal.limit_value:g}"
    left = refusal.limit_value - refusal.usage
    return f"asks {hours:g} GPU-hours, {left:g} left in the budget"


def _inventory_reason(request: Request) -> str:
    kind = f"MIG {request.mig_profile} instances" if request.mig_profile else "whole GPUs"
    model = f" of model {request.gpu_model}" if request.gpu_model else ""
    return f"the cluster never has {request.gpus} {kind}{model} for one booking"
