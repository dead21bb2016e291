"""Websocket routes, one visible list."""

websocket_urlpatterns: list = []
