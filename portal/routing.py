"""Websocket routes, one visible list."""

from django.urls import path

from agents import protocol
from portal.consumers.agent import AgentConsumer
from portal.consumers.live import LiveConsumer

# Browsers: session cookie, origin checked (asgi.py).
websocket_urlpatterns: list = [
    path("ws/live/", LiveConsumer.as_asgi()),
]

# Agents authenticate with their node token (no cookies, no Origin header): asgi.py routes them
# past the browser stack's origin check.
agent_websocket_urlpatterns = [
    path(protocol.WEBSOCKET_PATH.lstrip("/"), AgentConsumer.as_asgi()),
]
