"""Starting advance reservations when their window opens, and moving them off lost devices.

A reservation is a fixed block placed at submission. If a node it was placed on is down or
draining when the window opens, the pass moves it to other free devices of the same kind for
the rest of the window, or fails it with the reason (and the owner is told). A reservation
holding a device that its agent no longer reports (retired) is moved, or failed, when the
register retires the device; one still holding a retired device when its window opens (its
move was busy) is treated the same way then.
"""

from datetime import datetime

from django.db import transaction

from agents.protocol import image_runtimes
from portal.errors import Busy
from portal.models import Allocation, Booking, Node
from portal.services.booking import events
from portal.services.booking.bookings import allocations_write, booking_transition
from portal.services.booking.project_reservations import holds_against
from portal.services.booking.transitions import booking_cas
from portal.services.core.locking import lock_nodes
from portal.services.inventory import placement
from portal.services.inventory import selectors as inventory

State = Booking.State


def reservations_start_due(*, now: datetime) -> int:
    """Activate every planned reservation whose window has opened; returns how many started.

    Each in its own short transaction; only a reservation that must move off a down node locks
    nodes (the candidates for its move).
    """
    due = (
        Booking.objects.filter(state=State.PLANNED, start__lte=now)
        .prefetch_related("allocations__gpu__node", "allocations__mig_instance")
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
    live = [a for a in booking.allocations.all() if a.live]
    down = sorted({a.gpu.node.hostname for a in live if a.gpu.node.state != Node.State.UP})
    retired = any(a.gpu.retired_at or (a.mig_instance and a.mig_instance.retired_at) for a in live)
    if down:
        why = f"node {', '.join(down)} is down"
        moved = f"moved off {', '.join(down)} (node down)"
    elif retired:
        why, moved = "a device it held is no longer reported", "moved off a retired device"
    if (down or retired) and not _move(booking, now, moved):
        _fail(booking, now, f"{why} and no other devices are free for the window")
        return 0
    if booking_cas(booking.pk, to=State.ACTIVE, started_at=now):
        events.booking_changed(booking, "started")
        return 1
    return 0


def reservation_move_off_retired(*, booking_id: int, now: datetime, reason: str) -> None:
    """Move a planned reservation off devices just retired (`reason` says which), or fail it.

    Runs in the register's transaction, in a savepoint: if the candidate nodes are busy the
    reservation is left as it is, and moved (or failed) when its window opens.
    """
    booking = Booking.objects.filter(pk=booking_id, state=State.PLANNED).first()
    if booking is None:
        return
    try:
        with transaction.atomic():
            if not _move(booking, now, f"moved: {reason}"):
                _fail(booking, now, f"{reason} and no other devices are free for the window")
    except Busy:
        return


def _fail(booking: Booking, now: datetime, detail: str) -> None:
    if booking_transition(booking.pk, to=State.FAILED, now=now, detail=detail):
        events.booking_changed(booking, "failed")


def _move(booking: Booking, now: datetime, detail: str) -> bool:
    """Re-place the rest of the window on live devices of the same kind on up nodes; False if
    none are free. The booking's own live allocations are let go first."""
    lock_nodes(
        inventory.candidate_node_ids(gpu_model=booking.gpu_model, mig_profile=booking.mig_profile)
    )
    # Held to commit: a cancel racing in waits, instead of ending the booking just before
    # new live allocations are written for it (a cancelled booking would hold devices).
    if not Booking.objects.select_for_update().filter(pk=booking.pk, state=State.PLANNED).exists():
        return False
    start = max(now, booking.start)
    with transaction.atomic():
        # Its own devices are free to it again (those that are still live may be chosen).
        Allocation.objects.filter(booking=booking, live=True).update(live=False)
        devices, _, _ = placement.devices_for_window(
            start=start,
            end=booking.end,
            gpus=booking.gpus,
            mig_profile=booking.mig_profile,
            gpu_model=booking.gpu_model,
            mixed_models=booking.mixed_models,
            runtimes=image_runtimes(booking.image) if booking.image else (),
            gpu_fraction=booking.gpu_fraction,
            gpu_memory_mib=booking.gpu_memory_mib,
            cpus=booking.cpus,
            memory_mib=booking.memory_mib,
            project_holds=holds_against(project=booking.project.slug, start=start, end=booking.end),
        )
        if not devices or not allocations_write(
            booking=booking, devices=devices, start=start, end=booking.end
        ):
            transaction.set_rollback(True)
            return False
    Booking.objects.filter(pk=booking.pk).update(state_detail=detail)
    return True
