"""The websocket on which the portal pushes "desired state changed" to a node's agent.

The consumer only authenticates (node token in the `authorization` header), joins the node's
group and forwards; services send to the group after commit (services.agents.desired_push).
"""

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer

from portal.services.live import agent_group
from portal.services.nodes import node_for_token, node_mark_seen

CLOSE_UNAUTHORIZED = 4401


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
        node = await _authenticate(_bearer(self.scope))
        if node is None:
            await self.close(code=CLOSE_UNAUTHORIZED)
            return
        self.group = agent_group(node.pk)
        await self.channel_layer.group_add(self.group, self.channel_name)
        await self.accept()

    async def disconnect(self, code):
        if self.group:
            await self.channel_layer.group_discard(self.group, self.channel_name)

    async def receive_json(self, content, **kwargs):
        pass  # agents speak over HTTP; the socket only carries pushes to them

    async def desired_changed(self, event):
        await self.send_json({"type": "desired_changed", "generation": event.get("generation", 0)})
