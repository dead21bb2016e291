"""Websocket routes, one visible list."""

from django.urls import path

from portal.consumers.live import LiveConsumer

websocket_urlpatterns: list = [
    path("ws/live/", LiveConsumer.as_asgi()),
]
