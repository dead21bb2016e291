"""The agent push websocket, through the real ASGI application and the Redis channel layer."""

import pytest
from asgiref.sync import async_to_sync
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.utils import timezone

from agents import protocol
from portal.asgi import application
from portal.services.agents import agent_desired
from portal.services.bookings import booking_cancel
from tests.factories import UserFactory, make_active_booking, make_agent_node

pytestmark = pytest.mark.django_db(transaction=True)


def _communicator(token: str | None) -> WebsocketCommunicator:
    headers = [(b"authorization", f"Bearer {token}".encode())] if token else []
    return WebsocketCommunicator(application, protocol.WEBSOCKET_PATH, headers=headers)


def test_it_pushes_desired_changed_when_a_booking_on_the_node_is_cancelled(allocation_passes):
    node, token = make_agent_node("node-ws", gpus=1)
    owner = UserFactory(username="erin")
    booking = make_active_booking([node.gpus.get()], owner=owner)

    async def scenario():
        ws = _communicator(token)
        connected, _ = await ws.connect()
        assert connected
        await database_sync_to_async(booking_cancel)(
            user=owner, booking_id=booking.pk, now=timezone.now()
        )
        message = await ws.receive_json_from(timeout=5)
        await ws.disconnect()
        return message

    message = async_to_sync(scenario)()
    push = protocol.from_json(protocol.PushMessage, message)
    assert push.type == "desired_changed"
    assert push.generation == agent_desired(node_id=node.pk).generation
    assert agent_desired(node_id=node.pk).bookings == []


def test_it_does_not_push_to_other_nodes(allocation_passes):
    node, _ = make_agent_node("node-1", gpus=1)
    _, other_token = make_agent_node("node-2", gpus=1)
    owner = UserFactory(username="finn")
    booking = make_active_booking([node.gpus.get()], owner=owner)

    async def scenario():
        ws = _communicator(other_token)
        assert (await ws.connect())[0]
        await database_sync_to_async(booking_cancel)(
            user=owner, booking_id=booking.pk, now=timezone.now()
        )
        nothing = await ws.receive_nothing(timeout=0.5)
        await ws.disconnect()
        return nothing

    assert async_to_sync(scenario)() is True


@pytest.mark.parametrize("token", [None, "gpa_not-a-real-token"])
def test_it_rejects_an_agent_without_a_valid_token(token):
    make_agent_node("node-z", gpus=1)

    async def scenario():
        ws = _communicator(token)
        result = await ws.connect()
        await ws.disconnect()
        return result

    connected, code = async_to_sync(scenario)()
    assert connected is False
    assert code == 4401
