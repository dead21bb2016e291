"""The websocket on which the portal pushes "desired state changed" to a node's agent.

The consumer only authenticates (node token in the `authorization` header), joins the node's
group and forwards; services send to the group after commit (services.agents.desired_push).
When the database fails while it authenticates or records the heartbeat, it accepts only to
close at once with 1013 ("try again later") and says why: the agent reconnects with backoff.
"""

import logging

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from django.db import DatabaseError

from portal.services.fleet.nodes import node_mark_seen
from portal.services.fleet.selectors import node_for_token
from portal.services.realtime.live import agent_group

log = logging.getLogger(__name__)

CLOSE_UNAUTHORIZED = 4401
CLOSE_TRY_AGAIN = 1013  # RFC 6455 registry: "Try Again Later"


def _bearer(scope) -> str:
    for name, value in scope.get("headers", []):
        if name.lower() == b"authorization":
            kind, _, raw = value.decode("latin-1").partition(" ")
            return raw.strip() if kind.lower() == "bearer" else ""
    return ""


@database_sync_to_async
def _authenticate(raw: str):
    node = node_for_token(raw)
    if node is not None:
        node_mark_seen(node=node)
    return node


class AgentConsumer(AsyncJsonWebsocketConsumer):
    """One agent's push channel: messages {"type": "desired_changed", "generation": n}."""

    group = None

    async def connect(self):
        try:
            node = await _authenticate(_bearer(self.scope))
        except DatabaseError as exc:
            log.warning("agent websocket: database error while authenticating: %s", exc)
            await self.accept()
            await self.close(code=CLOSE_TRY_AGAIN, reason="portal database unavailable; retry")
            return
        if node is None:
            await self.close(code=CLOSE_UNAUTHORIZED)
            return
        self.group = agent_group(node.pk)
        await self.channel_layer.group_add(self.group, self.channel_name)
        await self.accept()

    async def disconnect(self, code):
        if self.group:
            await self.channel_layer.group_discard(self.group, self.channel_name)

    async def receive(self, text_data=None, bytes_data=None, **kwargs):
        pass  # agents speak over HTTP; the socket only carries pushes, so any frame is ignored

    async def desired_changed(self, event):
        await self.send_json({"type": "desired_changed", "generation": event.get("generation", 0)})
