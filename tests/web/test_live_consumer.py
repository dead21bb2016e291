"""The browsers' live feed over the real (Redis) channel layer."""

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from channels.layers import get_channel_layer
from channels.testing import WebsocketCommunicator
from django.contrib.auth.models import AnonymousUser

from portal.consumers.live import LiveConsumer
from portal.services.realtime.live import booking_broadcast


async def _connect(user):
    communicator = WebsocketCommunicator(LiveConsumer.as_asgi(), "/ws/live/")
    communicator.scope["user"] = user
    connected, code = await communicator.connect()
    return communicator, connected, code


@pytest.mark.django_db
def test_it_accepts_then_closes_anonymous_sockets_with_4401():
    # Closed before accept, the browser would see a failed handshake (1006), not 4401, and
    # keep reconnecting: the page must get the close code that tells it "signed out".
    async def run():
        communicator, connected, _ = await _connect(AnonymousUser())
        closed = await communicator.receive_output(timeout=5)
        await communicator.disconnect()
        return connected, closed

    connected, closed = async_to_sync(run)()
    assert connected is True
    assert closed == {"type": "websocket.close", "code": 4401}


@pytest.mark.django_db
def test_it_forwards_telemetry_bookings_and_queue_changes(user):
    async def run():
        communicator, connected, _ = await _connect(user)
        assert connected
        layer = get_channel_layer()
        reading = {"uuid": "GPU-x", "utilization_gpu": 12.0}
        await layer.group_send(
            "telemetry",
            {"type": "telemetry.readings", "node": "n1", "time": "t", "readings": [reading]},
        )
        first = await communicator.receive_json_from(timeout=5)
        await layer.group_send("queue", {"type": "queue.changed"})
        second = await communicator.receive_json_from(timeout=5)
        await communicator.disconnect()
        return first, second

    first, second = async_to_sync(run)()
    assert first["type"] == "telemetry.readings"
    assert first["readings"][0]["utilization_gpu"] == 12.0
    assert second == {"type": "queue.changed"}


@pytest.mark.django_db
def test_it_delivers_booking_changes_on_the_queue_and_owner_groups(user):
    async def run():
        communicator, _, _ = await _connect(user)
        await communicator.send_json_to({"type": "ping"})
        pong = await communicator.receive_json_from(timeout=5)
        await sync_to_async(booking_broadcast)(
            booking_id=7, owner_id=user.pk, state="active", event="started"
        )
        messages = [await communicator.receive_json_from(timeout=5) for _ in range(2)]
        await communicator.disconnect()
        return pong, messages

    pong, messages = async_to_sync(run)()
    assert pong == {"type": "pong"}
    expected = {"type": "booking.changed", "booking_id": 7, "state": "active", "event": "started"}
    assert messages == [expected, expected]


@pytest.mark.django_db
@pytest.mark.parametrize(
    "junk", [{"text_data": "[1]"}, {"text_data": "not json"}, {"bytes_data": b"x"}]
)
def test_it_ignores_junk_from_the_browser_and_keeps_the_socket(user, junk):
    async def run():
        communicator, _, _ = await _connect(user)
        await communicator.send_to(**junk)
        await communicator.send_json_to({"type": "ping"})
        pong = await communicator.receive_json_from(timeout=5)
        await communicator.disconnect()
        return pong

    assert async_to_sync(run)() == {"type": "pong"}
