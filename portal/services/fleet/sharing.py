"""A GPU's sharing mode: exclusive (whole, or MIG slices, to one booking) or shared (fractions).

Staff change it (``gpu_set_sharing``, per GPU or for a node's GPUs). A GPU that holds live
allocations of the other kind keeps its mode: a whole-GPU booking on a GPU made shared, or
fractions on a GPU made exclusive, would break the rule that the two never mix (409, naming the
bookings). The change is made under the node's lock, which every writer of allocations takes.
"""

from datetime import datetime

from django.db import transaction

from portal.errors import Conflict, NotAllowed, NotFound, ValidationFailed
from portal.models import Allocation, Gpu
from portal.services.access import permissions
from portal.services.access.audit import SYSTEM, Source, audit_record
from portal.services.booking import events
from portal.services.core.locking import lock_nodes


def gpu_set_sharing(*, actor, gpu_id: int, sharing: str, now: datetime, source: Source = SYSTEM):
    """Put GPU ``gpu_id`` in ``sharing`` mode ("exclusive" or "shared"); audited, and a pass is
    asked for. Refused: 400 an unknown mode, 403 without the right, 404 an unknown GPU, 409 a
    GPU in MIG mode made shared or one holding live allocations of the other kind."""
    _check(actor, sharing)
    with transaction.atomic(durable=True):
        gpu = Gpu.objects.filter(pk=gpu_id, retired_at__isnull=True).first()
        if gpu is None:
            raise NotFound(f"No live GPU {gpu_id}.")
        lock_nodes([gpu.node_id])
        _set(actor, source, Gpu.objects.get(pk=gpu.pk), sharing, now)
    return Gpu.objects.select_related("node").get(pk=gpu_id)


def node_set_sharing(*, actor, node_id: int, sharing: str, now: datetime, source=SYSTEM) -> int:
    """Put every live GPU of node ``node_id`` not in MIG mode in ``sharing`` mode, all or none
    (409 names the first GPU that cannot change); returns how many changed."""
    _check(actor, sharing)
    with transaction.atomic(durable=True):
        if not lock_nodes([node_id]):
            raise NotFound(f"No node {node_id}.")
        gpus = Gpu.objects.filter(node_id=node_id, retired_at__isnull=True, mig_mode=False)
        return sum(_set(actor, source, gpu, sharing, now) for gpu in gpus.order_by("index"))


def _check(actor, sharing: str) -> None:
    if sharing not in Gpu.Sharing.values:
        raise ValidationFailed.field(
            "sharing", f"must be one of {', '.join(Gpu.Sharing.values)}, not {sharing!r}."
        )
    if not permissions.can(actor, "gpu.sharing"):
        raise NotAllowed("Only admins with the right to change GPUs may change their sharing.")


def _set(actor, source: Source, gpu: Gpu, sharing: str, now: datetime) -> bool:
    """Change one GPU (its node locked by the caller); False when it is in that mode already."""
    if gpu.sharing == sharing:
        return False
    if sharing == Gpu.Sharing.SHARED and gpu.mig_mode:
        raise Conflict(
            f"{gpu} is in MIG mode: it is booked by its slices and cannot be shared.",
            fields={"sharing": "the GPU is in MIG mode"},
        )
    held = Allocation.objects.filter(gpu=gpu, live=True, end__gt=now)
    # Made shared: no whole device may be held; made exclusive: no fraction.
    held = held.filter(gpu_memory_mib__isnull=sharing == Gpu.Sharing.SHARED)
    bookings = sorted(set(held.values_list("booking_id", flat=True)))
    if bookings:
        kind = "whole-GPU" if sharing == Gpu.Sharing.SHARED else "fractional"
        names = ", ".join(map(str, bookings[:10]))
        raise Conflict(
            f"{gpu} holds live {kind} allocations (booking {names}); it can be made {sharing} "
            "once they end.",
            fields={"sharing": f"live {kind} bookings: {names}"},
            extra={"bookings": bookings},
        )
    Gpu.objects.filter(pk=gpu.pk).update(sharing=sharing)
    audit_record(
        action="gpu.sharing",
        actor=actor,
        source=source,
        target=gpu,
        before={"sharing": gpu.sharing},
        after={"sharing": sharing},
    )
    events.node_changed(node_id=gpu.node_id, change="sharing")
    return True
