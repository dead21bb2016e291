"""Starting advance reservations when their window opens, and moving them off nodes that died.

A reservation is a fixed block placed at submission. If a node it was placed on is down or
draining when the window opens, the pass moves it to other free devices of the same kind for
the rest of the window, or fails it with the reason (and the owner is told).
"""

from datetime import datetime

from django.db import transaction

from portal.errors import Busy
from portal.models import Allocation, Booking, Node
from portal.services import events, inventory, placement
from portal.services.bookings import allocations_write, booking_transition
from portal.services.locking import lock_nodes

State = Booking.State


def reservations_start_due(*, now: datetime) -> int:
    """Activate every planned reservation whose window has opened; returns how many started.

    Each in its own short transaction; only a reservation that must move off a down node locks
    nodes (the candidates for its move).
    """
    due = (
        Booking.objects.filter(state=State.PLANNED, start__lte=now)
        .prefetch_related("allocations__gpu__node")
        .order_by("start", "id")
    )
    started = 0
    for booking in due:
        try:
            with transaction.atomic(durable=True):
                started += _start_due(booking, now)
        except Busy:
            continue  # its nodes are busy: the next pass tries again
    return started


def _start_due(booking: Booking, now: datetime) -> int:
    down = sorted(
        {
            a.gpu.node.hostname
            for a in booking.allocations.all()
            if a.live and a.gpu.node.state != Node.State.UP
        }
    )
    if down and not _move(booking, now, down):
        detail = f"node {', '.join(down)} is down and no other devices are free for the window"
        if booking_transition(
            booking.pk, from_states=(State.PLANNED,), to=State.FAILED, now=now, detail=detail
        ):
            events.booking_changed(booking, "failed")
        return 0
    if Booking.objects.filter(pk=booking.pk, state=State.PLANNED).update(
        state=State.ACTIVE, started_at=now
    ):
        events.booking_changed(booking, "started")
        return 1
    return 0


def _move(booking: Booking, now: datetime, down: list[str]) -> bool:
    """Re-place the rest of the window on up devices of the same kind; False if none are free."""
    lock_nodes(
        inventory.candidate_node_ids(gpu_model=booking.gpu_model, mig_profile=booking.mig_profile)
    )
    # Held to commit: a cancel racing in waits, instead of ending the booking just before
    # new live allocations are written for it (a cancelled booking would hold devices).
    if not Booking.objects.select_for_update().filter(pk=booking.pk, state=State.PLANNED).exists():
        return False
    devices, _ = placement.devices_for_window(
        start=now,
        end=booking.end,
        gpus=booking.gpus,
        mig_profile=booking.mig_profile,
        gpu_model=booking.gpu_model,
    )
    if not devices:
        return False
    with transaction.atomic():
        Allocation.objects.filter(booking=booking, live=True).update(live=False)
        if not allocations_write(booking=booking, devices=devices, start=now, end=booking.end):
            transaction.set_rollback(True)
            return False
    Booking.objects.filter(pk=booking.pk).update(
        state_detail=f"moved off {', '.join(down)} (node down)"
    )
    return True
