"""Submission-time check the portal uses to refuse bookings that could never run."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from scheduler.placement import (
    Node,
    build_nodes,
    fits_window,
    is_multi_node,
    keeps_one_model,
    searches,
    site_of,
)
from scheduler.priority import profile_fractions, request_size
from scheduler.quota import HOST_LIMITS, QuotaSide, over, position_refusal
from scheduler.reserve import Slot, Wanted, reserve
from scheduler.shortfall import never_held
from scheduler.timeline import NodeTimeline
from scheduler.types import Device, NodeResources, Policy, Quota, Request


@dataclass(frozen=True)
class Refusal:
    """Why a request could never run, for the caller to word.

    ``limit`` is "request" (no GPU or no duration), "inventory" (``limit_value``: the most
    matching devices one booking could ever get), "max_gpus", "gpu_hours_budget", "max_cpus" or
    "max_memory_mib" (the quota's value), "cpus" or "memory_mib" (more than any node has);
    ``asks`` is what the request asks in the same unit; ``text`` a plain wording.
    """

    limit: str
    limit_value: float
    asks: float
    text: str
    scope: str = ""  # for a quota: "user" (the user in the project) or "project"


def admission_refusal(
    request: Request,
    devices: tuple[Device, ...],
    quota: Quota | Sequence[QuotaSide] | None = None,
    *,
    fixed_window: bool = False,
    node_resources: Mapping[str, NodeResources] | None = None,
    policy: Policy | None = None,
) -> Refusal | None:
    """Why ``request`` could never run on ``devices`` under ``quota`` (None: it could).

    ``quota`` is one Quota, or the sides of a quota position (the user in the project, the
    project): each is checked by the one quota rule with nothing used or held.

    The rules that would place it decide: the allocator's (one node when the request fits on
    one, else whole nodes of whole GPUs of the model), or with ``fixed_window`` those of an
    advance reservation (``reserve()`` with nothing held). Node state is ignored (a down node may
    come back); only the inventory and the limits count, not what is used so far (a budget
    period rolls).

    With ``node_resources`` (``State.node_resources``; ``policy`` for the defaults per GPU), a
    request whose devices fit but that asks more cores or memory per node than any node that
    could hold its GPUs has is refused with ``limit`` "cpus" or "memory_mib" (the request's
    field; ``limit_value`` the most such a node has).
    """
    if request.gpus <= 0 or request.duration_s <= 0:
        text = "a booking needs at least one GPU and a positive duration"
        return Refusal("request", 0.0, float(request.gpus), text)
    if request.fractional:
        most = None if _fraction_fits(request, devices) else 0
    elif _fits_one_node(request, devices):
        most = None
    elif fixed_window:
        most = _most_reserved(request, devices)
    else:
        most = _most_queued(request, devices)
    if most is not None:
        return Refusal("inventory", float(most), float(request.gpus), _inventory_text(request))
    if node_resources:
        nodes = build_nodes(devices, 0.0, node_resources, policy)
        multi = is_multi_node(request, nodes)
        short = never_held(request, nodes, multi)
        if short is not None:
            return Refusal(
                short.field, float(short.capacity), float(short.asks), short.never_text()
            )
        host = _host_refusal(request, nodes, multi, _limits(quota))
        if host is not None:
            return host
    size = request_size(request, profile_fractions(devices))
    hours = size * request.duration_s / 3600.0
    refusal = position_refusal(_limits(quota), gpus=size, gpu_hours=hours)
    if refusal is None:
        return None
    if refusal.limit == "max_gpus":
        text = f"asks {size:g} GPUs at once, the limit is {refusal.limit_value:g}"
        return Refusal("max_gpus", refusal.limit_value, size, text, refusal.scope)
    left = refusal.limit_value - refusal.usage
    text = f"asks {hours:g} GPU-hours, {left:g} left in the budget"
    return Refusal("gpu_hours_budget", refusal.limit_value, hours, text, refusal.scope)


def _host_refusal(request: Request, nodes: list[Node], multi: bool, sides) -> Refusal | None:
    """A limit of cores or memory (``Quota.max_cpus``, ``max_memory_mib``) below the least the
    request would hold on any nodes that could take it (its GPUs' fewest nodes, each at its
    least demand), or None."""
    able = [node for node in nodes if node.capacity is not None]
    if not able or not sides or request.fractional:
        return None
    demands = [node.demand_of(request) for node in able]
    count = 1
    if multi:
        count = -(-request.gpus // max(node.full.bit_count() for node in able))
    least = (count * min(d[0] for d in demands), count * min(d[1] for d in demands))
    for side in sorted(sides, key=lambda side: side.scope != "project"):
        for index, (limit, unit) in enumerate(HOST_LIMITS):
            value = getattr(side.quota, limit)
            if over(value, least[index]):
                text = f"asks {least[index]:g} {unit} at once, the limit is {value:g}"
                return Refusal(limit, float(value), float(least[index]), text, side.scope)
    return None


def _limits(quota: Quota | Sequence[QuotaSide] | None) -> tuple[QuotaSide, ...]:
    if quota is None:
        return ()
    if isinstance(quota, Quota):
        return (QuotaSide("user", quota).limits_only(),)
    return tuple(side.limits_only() for side in quota)


def never_fits(
    request: Request,
    devices: tuple[Device, ...],
    quota: Quota | None = None,
    node_resources: Mapping[str, NodeResources] | None = None,
    policy: Policy | None = None,
) -> str | None:
    """Why ``request`` could never run on ``devices`` under ``quota``, in words (None: it could)."""
    refusal = admission_refusal(
        request, devices, quota, node_resources=node_resources, policy=policy
    )
    return refusal.text if refusal is not None else None


def _fits_one_node(request: Request, devices: tuple[Device, ...]) -> bool:
    """Some node has as many matching devices as the request asks: then both rules place it,
    on an empty cluster, on one node (the common case, answered without building either)."""
    if request.runtimes:
        return False  # runtimes are node properties the full rules check
    # Where the request keeps one model, the devices of one node and one model.
    one = keeps_one_model(
        request.gpus, request.mig_profile, request.gpu_model, request.mixed_models
    )
    counts: dict[tuple[str, str], int] = {}
    for device in devices:
        if device.shared:
            continue  # fractions only
        if device.profile == request.mig_profile and (
            request.gpu_model is None or device.model == request.gpu_model
        ):
            key = (device.node, device.model if one else "")
            counts[key] = counts.get(key, 0) + 1
    return max(counts.values(), default=0) >= request.gpus


def _fraction_fits(request: Request, devices: tuple[Device, ...]) -> bool:
    """Some shared GPU (of the model asked) could hold the fraction, with nothing else on it."""
    nodes = build_nodes(devices, 0.0)
    empty = [NodeTimeline(0.0, node.full) for node in nodes]
    return fits_window(nodes, empty, request, False, 0.0, 0.0)


def _most_queued(request: Request, devices: tuple[Device, ...]) -> int | None:
    """None when the allocator could place ``request`` on an empty cluster; else the most
    matching devices one booking could hold there."""
    nodes = build_nodes(devices, 0.0)
    multi = is_multi_node(request, nodes)
    empty = [NodeTimeline(0.0, node.full) for node in nodes]
    if fits_window(nodes, empty, request, multi, 0.0, 0.0):
        return None
    return _most_for_one(request, nodes)


def _most_reserved(request: Request, devices: tuple[Device, ...]) -> int | None:
    """None when ``reserve()`` could place ``request`` with nothing held; else how many matching
    devices the cluster has (a reservation may take them on several nodes)."""
    nodes = {name: i for i, name in enumerate(sorted({d.node for d in devices}))}
    slots = tuple(
        Slot(nodes[d.node], i, i if d.profile else None, d.model, d.profile, d.fraction)
        for i, d in enumerate(sorted(devices, key=lambda d: d.id))
        if not d.shared  # fractions only
    )
    wanted = Wanted(
        request.gpus, 0.0, 1.0, request.mig_profile, request.gpu_model, request.mixed_models
    )
    placement = reserve(wanted, slots, ())
    return None if placement.slots else placement.free


def _most_for_one(request: Request, nodes: list[Node]) -> int:
    """The most matching devices one booking could hold: on one node, or on whole nodes (of
    one model, where it keeps one)."""
    site = site_of(nodes)
    return max(_most_of(choice, nodes) for choice in searches(request, site, True))


def _most_of(request: Request, nodes: list[Node]) -> int:
    one = max(
        (n.need(request.mig_profile, request.device_match).bit_count() for n in nodes), default=0
    )
    if request.mig_profile is not None:
        return one
    whole = [n for n in nodes if n.whole and n.need(None, request.device_match) == n.full]
    return max(one, sum(n.full.bit_count() for n in whole))


def _inventory_text(request: Request) -> str:
    if request.fractional:
        model = f" {request.gpu_model}" if request.gpu_model else ""
        return f"no shared{model} GPU of the cluster can ever hold this fraction"
    kind = f"MIG {request.mig_profile} instances" if request.mig_profile else "whole GPUs"
    model = f" of model {request.gpu_model}" if request.gpu_model else ""
    if keeps_one_model(request.gpus, request.mig_profile, request.gpu_model, request.mixed_models):
        model = " of one model"
    return f"the cluster never has {request.gpus} {kind}{model} for one booking"
