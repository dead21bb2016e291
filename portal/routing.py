"""Websocket routes, one visible list."""

from django.urls import path, re_path

from agents import protocol
from portal.consumers.agent import AgentConsumer
from portal.consumers.live import LiveConsumer
from portal.consumers.sessions import SessionHttpProxy, SessionWebsocketProxy

# Browsers: session cookie, origin checked (asgi.py).
websocket_urlpatterns: list = [
    path("ws/live/", LiveConsumer.as_asgi()),
    # Interactive sessions' kernels and terminals (docs/interactive.md).
    re_path(r"^sessions/\d+/", SessionWebsocketProxy.as_asgi()),
]

# HTTP that asgi.py sends here instead of Django: the interactive sessions' reverse proxy.
SESSION_HTTP_PREFIX = "/sessions/"
session_http_app = SessionHttpProxy.as_asgi()

# Agents authenticate with their node token (no cookies, no Origin header): asgi.py routes them
# past the browser stack's origin check.
agent_websocket_urlpatterns = [
    path(protocol.WEBSOCKET_PATH.lstrip("/"), AgentConsumer.as_asgi()),
]
