"""Live updates to browsers and pushes to agents over the channel layer (after commit only)."""

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer

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


def booking_output_broadcast(*, booking_id: int, owner_id: int, log_tail: str) -> None:
    """Send a running booking's latest output tail to its owner's open pages."""
    message = {"type": "booking.output", "booking_id": booking_id, "log_tail": log_tail}
    group_send(user_group(owner_id), message)


def agents_push(node_ids) -> None:
    """Nudge the agents of these nodes to pull their desired state now (with its generation)."""
    from portal.services.agents import desired_push

    desired_push(node_ids=node_ids)
