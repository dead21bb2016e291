"""The agent push websocket, through the real ASGI application and the Redis channel layer."""

import pytest
from asgiref.sync import async_to_sync
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.utils import timezone

from agents import protocol
from portal.asgi import application
from portal.services.booking.bookings import booking_cancel
from portal.services.fleet.selectors import agent_desired
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


def test_it_closes_with_try_again_later_when_the_database_fails_during_connect():
    import asyncio
    from datetime import timedelta

    import psycopg
    from django.db import connection

    from portal.consumers.agent import CLOSE_TRY_AGAIN
    from portal.models import Node

    node, token = make_agent_node("node-db", gpus=1)
    Node.objects.filter(pk=node.pk).update(last_seen=timezone.now() - timedelta(minutes=5))
    db = connection.settings_dict
    dsn = dict(host=db["HOST"], port=db["PORT"], user=db["USER"], dbname=db["NAME"])
    hold = psycopg.connect(**dsn)  # holds the node's row: the heartbeat write waits for it
    admin = psycopg.connect(**dsn, autocommit=True)
    hold.execute("SELECT id FROM portal_node WHERE id = %s FOR UPDATE", [node.pk])

    def cancel_the_heartbeat() -> bool:
        # A real database error on the consumer's own query (as a statement timeout would be).
        row = admin.execute(
            "SELECT pid FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE %s",
            ['%UPDATE "portal_node"%'],
        ).fetchone()
        return bool(row) and admin.execute("SELECT pg_cancel_backend(%s)", [row[0]]).fetchone()[0]

    async def scenario():
        ws = _communicator(token)
        connecting = asyncio.ensure_future(ws.connect(timeout=10))
        for _ in range(200):
            if await asyncio.to_thread(cancel_the_heartbeat):
                break
            await asyncio.sleep(0.05)
        connected, _ = await connecting
        closed = await ws.receive_output(timeout=5)
        await ws.wait()
        return connected, closed

    try:
        connected, closed = async_to_sync(scenario)()
    finally:
        hold.rollback()
        hold.close()
        admin.close()
    assert connected is True  # accepted only to say why it closes: the agent sees the code
    assert closed["type"] == "websocket.close"
    assert closed["code"] == CLOSE_TRY_AGAIN == 1013  # "try again later"
    assert "database" in closed.get("reason", "")


def test_it_ignores_frames_it_does_not_understand_and_keeps_pushing(allocation_passes):
    node, token = make_agent_node("node-junk", gpus=1)
    owner = UserFactory(username="gus")
    booking = make_active_booking([node.gpus.get()], owner=owner)

    async def scenario():
        ws = _communicator(token)
        assert (await ws.connect())[0]
        await ws.send_to(text_data="{not json")
        await ws.send_to(bytes_data=b"\x00\x01")
        await database_sync_to_async(booking_cancel)(
            user=owner, booking_id=booking.pk, now=timezone.now()
        )
        message = await ws.receive_json_from(timeout=5)
        await ws.disconnect()
        return message

    assert async_to_sync(scenario)()["type"] == "desired_changed"
