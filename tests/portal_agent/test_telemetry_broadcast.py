"""Readings are broadcast to the channel-layer group "telemetry" after commit (Redis layer)."""

import pytest
from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer

from agents import protocol
from tests.factories import make_agent_node
from tests.portal_agent.conftest import AgentClient, reading

pytestmark = pytest.mark.django_db(transaction=True)


def test_it_broadcasts_stored_readings_to_the_telemetry_group():
    node, token = make_agent_node("node-live", gpus=1, mig_gpus=1)
    gpu = node.gpus.get(mig_mode=False)
    layer = get_channel_layer()
    channel = async_to_sync(layer.new_channel)()
    async_to_sync(layer.group_add)("telemetry", channel)

    response = AgentClient(token).readings(
        "node-live", [reading(gpu.uuid, utilization_gpu=12.5)], time="2026-02-02T02:02:02Z"
    )
    assert response.status_code == 202

    async def receive():
        import asyncio

        return await asyncio.wait_for(layer.receive(channel), timeout=5)

    message = async_to_sync(receive)()
    assert message["type"] == "telemetry.readings"
    assert message["node"] == "node-live"
    assert message["time"] == "2026-02-02T02:02:02Z"
    [sent] = message["readings"]
    assert protocol.from_json(protocol.DeviceReading, sent).utilization_gpu == 12.5
    assert sent["utilization_memory"] is None


def test_it_broadcasts_nothing_for_a_refused_batch():
    node, token = make_agent_node("node-quiet", gpus=1)
    layer = get_channel_layer()
    channel = async_to_sync(layer.new_channel)()
    async_to_sync(layer.group_add)("telemetry", channel)

    response = AgentClient(token).readings("node-quiet", [reading("GPU-not-here")])
    assert response.status_code == 400

    async def receive():
        import asyncio

        try:
            return await asyncio.wait_for(layer.receive(channel), timeout=0.5)
        except TimeoutError:
            return None

    assert async_to_sync(receive)() is None
