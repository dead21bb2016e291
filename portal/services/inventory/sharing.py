"""Room on a shared GPU, read from its live allocations: the start path's re-check.

The allocator packs fractions by ``scheduler.sharing``; the exclusion constraint (migration
0032) keeps whole devices apart from fractions but cannot add shares up. So a start of a fraction
re-checks here, under its node's lock (every writer of allocations on a node locks it first),
that the GPU is still shared and that its shares and memory stay within the GPU over the
fraction's window, at every instant of it.
"""

from datetime import datetime

from portal.models import Allocation, Gpu

EPS = 1e-9  # as scheduler.sharing: 0.25 * 4 fits in 1.0


def shared_room(*, gpu: Gpu, start: datetime, end: datetime) -> tuple[float, int]:
    """(compute, memory MiB) free on ``gpu`` over all of [start, end): its size less the most
    its live allocations hold at once in the window (a whole-device allocation holds all)."""
    rows = list(
        Allocation.objects.filter(live=True, gpu_id=gpu.pk, start__lt=end, end__gt=start)
        .order_by()
        .values_list("start", "end", "share", "gpu_memory_mib")
    )
    peak_compute, peak_memory = 0.0, 0
    # The use only rises where an allocation begins: the window's start and each start in it.
    for t in {start} | {max(row[0], start) for row in rows}:
        live = [row for row in rows if row[0] <= t < row[1]]
        peak_compute = max(peak_compute, sum(row[2] for row in live))
        peak_memory = max(peak_memory, sum(_memory(row, gpu) for row in live))
    return 1.0 - peak_compute, gpu.memory_mib - peak_memory


def _memory(row: tuple, gpu: Gpu) -> int:
    share, memory = row[2], row[3]
    return gpu.memory_mib if share >= 1.0 else (memory or int(share * gpu.memory_mib))


def share_fits(*, gpu_id: int, share: float, memory_mib: int, start, end) -> bool:
    """Whether a fraction (``share``, ``memory_mib``) fits on shared GPU ``gpu_id`` over
    [start, end) now: the GPU is live, shared and not in MIG mode, with room enough."""
    gpu = Gpu.objects.filter(
        pk=gpu_id, retired_at__isnull=True, mig_mode=False, sharing=Gpu.Sharing.SHARED
    ).first()
    if gpu is None:
        return False
    compute, memory = shared_room(gpu=gpu, start=start, end=end)
    return share <= compute + EPS and memory_mib <= memory
