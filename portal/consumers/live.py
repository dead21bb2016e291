"""The browsers' live feed: telemetry readings, booking and queue changes, forwarded as JSON.

The consumer only authenticates, joins groups and forwards; what to send is decided by the
services and the telemetry ingest, after commit, so a consumer holds no business rule. Pages re-fetch
what a change affects; the overview applies the patches portal.web.overview sends instead.
"""

from channels.generic.websocket import AsyncJsonWebsocketConsumer

from portal.services.realtime.live import QUEUE_GROUP, user_group

TELEMETRY_GROUP = "telemetry"
# Close code the page reads as "signed out: do not reconnect" (docs/live.md). The socket is
# accepted first and then closed with it: a refusal before accept reaches the browser as a
# failed handshake (code 1006), which the page cannot tell from a network drop.
UNAUTHENTICATED = 4401


class LiveConsumer(AsyncJsonWebsocketConsumer):
    """One socket per open page, authenticated by the session cookie."""

    async def connect(self):
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await self.accept()
            await self.close(code=UNAUTHENTICATED)
            return
        self.groups_joined = [TELEMETRY_GROUP, QUEUE_GROUP, user_group(user.pk)]
        for group in self.groups_joined:
            await self.channel_layer.group_add(group, self.channel_name)
        await self.accept()

    async def disconnect(self, code):
        for group in getattr(self, "groups_joined", []):
            await self.channel_layer.group_discard(group, self.channel_name)

    async def receive(self, text_data=None, bytes_data=None, **kwargs):
        # A frame that is not JSON text (JSONDecodeError is a ValueError) is ignored: raising
        # would close the socket, and the page would miss updates until it reconnects.
        try:
            await super().receive(text_data, bytes_data, **kwargs)
        except ValueError:
            return

    async def receive_json(self, content, **kwargs):
        """Browsers only listen; a ping gets a pong so clients can check the line."""
        if isinstance(content, dict) and content.get("type") == "ping":
            await self.send_json({"type": "pong"})

    async def telemetry_readings(self, event):
        await self.send_json(event)

    async def booking_changed(self, event):
        await self.send_json(event)

    async def booking_output(self, event):
        await self.send_json(event)

    async def queue_changed(self, event):
        await self.send_json(event)

    async def overview_patch(self, event):
        await self.send_json(event)
