"""Choosing devices for an advance reservation among those free for its whole window.

Pure functions over plain tuples so the rules read in one place: one node when the request fits
on one, whole free nodes when it does not, best fit (the fullest node that still fits) to keep
whole nodes free for large requests, MIG slices packed onto GPUs already partly used.
"""

from collections import defaultdict
from dataclasses import dataclass


@dataclass(frozen=True)
class FreeDevice:
    """A device free for the window: gpu id, MIG instance id (None for a whole GPU), node id."""

    node_id: int
    gpu_id: int
    mig_id: int | None
    fraction: float
    node_gpus: int  # whole GPUs of this model the node has at all


def place_gpus(free: list[FreeDevice], gpus: int) -> list[FreeDevice] | None:
    """Pick `gpus` whole GPUs: best-fit node when they fit on one, else whole free nodes."""
    by_node: dict[int, list[FreeDevice]] = defaultdict(list)
    for device in sorted(free, key=lambda d: (d.node_id, d.gpu_id)):
        by_node[device.node_id].append(device)
    fitting = [(len(devs), node) for node, devs in by_node.items() if len(devs) >= gpus]
    if fitting:
        _, node = min(fitting)
        return by_node[node][:gpus]
    whole = [devs for devs in by_node.values() if len(devs) == devs[0].node_gpus]
    whole.sort(key=lambda devs: (-len(devs), devs[0].node_id))
    chosen: list[FreeDevice] = []
    for devs in whole:
        if len(chosen) >= gpus:
            break
        chosen += devs[: gpus - len(chosen)]
    return chosen if len(chosen) == gpus else None


def place_mig(free: list[FreeDevice], busy_slices_by_gpu: dict[int, float]) -> FreeDevice | None:
    """Pick one free MIG instance, on the GPU with the most slices already in use."""
    if not free:
        return None
    return min(
        free, key=lambda d: (-busy_slices_by_gpu.get(d.gpu_id, 0.0), d.node_id, d.gpu_id, d.mig_id)
    )
