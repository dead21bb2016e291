"""Listening on the channel layer as an owner's open page does, for tests of live messages."""

import asyncio

from asgiref.sync import async_to_sync
from channels.layers import DEFAULT_CHANNEL_LAYER, InMemoryChannelLayer, channel_layers

from portal.services.realtime.live import user_group


def listen_as_owner(owner_id: int):
    """Join the owner's group on a new channel; returns receive(timeout) -> message or None."""
    # A layer of its own: the shared one keeps asyncio locks from earlier tests' event loops (a
    # receive that timed out leaves its lock held, bound to a loop that is gone). In memory,
    # only the shared instance sees what the portal sends.
    layer = channel_layers[DEFAULT_CHANNEL_LAYER]
    if not isinstance(layer, InMemoryChannelLayer):
        layer = channel_layers.make_backend(DEFAULT_CHANNEL_LAYER)
    channel = async_to_sync(layer.new_channel)()
    async_to_sync(layer.group_add)(user_group(owner_id), channel)

    def receive(timeout=5.0):
        async def get():
            try:
                return await asyncio.wait_for(layer.receive(channel), timeout=timeout)
            except TimeoutError:
                return None

        return async_to_sync(get)()

    return receive
