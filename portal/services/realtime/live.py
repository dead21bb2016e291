"""Live updates to browsers and pushes to agents over the channel layer (after commit only)."""

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer

from portal.models import Booking

QUEUE_GROUP = "queue"


def user_group(user_id: int) -> str:
    return f"bookings.user.{user_id}"


def agent_group(node_id: int) -> str:
    return f"agent.node.{node_id}"


def group_send(group: str, message: dict) -> None:
    layer = get_channel_layer()
    if layer is not None:
        async_to_sync(layer.group_send)(group, message)


def booking_broadcast(*, booking_id: int, owner_id: int, state: str, event: str) -> None:
    """Tell open pages that a booking changed; they re-fetch what they show."""
    message = {"type": "booking.changed", "booking_id": booking_id, "state": state, "event": event}
    group_send(QUEUE_GROUP, message)
    group_send(user_group(owner_id), message)


def booking_fact_broadcast(fact) -> None:
    """Subscriber: tell open pages about a booking fact, with the booking's state now."""
    booking = Booking.objects.filter(pk=fact.booking_id).values("owner_id", "state").first()
    if booking is not None:
        booking_broadcast(
            booking_id=fact.booking_id,
            owner_id=booking["owner_id"],
            state=booking["state"],
            event=fact.payload["event"],
        )


def booking_output_broadcast(*, booking_id: int, owner_id: int, log_tail: str) -> None:
    """Send a running booking's latest output tail to its owner's open pages."""
    message = {"type": "booking.output", "booking_id": booking_id, "log_tail": log_tail}
    group_send(user_group(owner_id), message)


def queue_fact_broadcast(fact) -> None:
    """Subscriber: the pass stored new plans; open queue pages refresh their queue view."""
    group_send(QUEUE_GROUP, {"type": "queue.changed"})
