"""Busy, retry: 503 with Retry-After, never a 500, when the portal cannot serve a request well.

A dependency that is down (PostgreSQL, Redis, no pooled connection free in time): the request wrote
nothing that committed, since every command is one transaction and the cache and the channel layer
hold no truth. Beyond capacity (more requests in a worker than it admits, or one that waited too
long for its turn): refused before it costs anything. Either way the answer is "busy, retry", in
the API's one error shape for /api/ and as a short plain page elsewhere, and the next request after
the outage or the burst works again.
"""

import json
import logging
import time

import redis
from django.conf import settings
from django.db import InterfaceError, OperationalError
from django.http import HttpResponse, JsonResponse

from portal.api.errors import error_body
from portal.wsgi_threads import ADMITTED_AT

log = logging.getLogger(__name__)

RETRY_AFTER_S = 5
# OperationalError covers a refused or lost PostgreSQL connection and lock timeouts alike.
_DOWN = (
    redis.exceptions.ConnectionError,
    redis.exceptions.TimeoutError,
    OperationalError,
    InterfaceError,
)
_PAGE = (
    "<!doctype html><title>Busy</title><h1>The portal is busy</h1>"
    "<p>A service it depends on is not answering. Retry in a few seconds.</p>"
)
_FULL_MESSAGE = "The portal is serving as many requests as it can; retry in a second."
_FULL_PAGE = (
    "<!doctype html><title>Busy</title><h1>The portal is busy</h1>"
    "<p>It is serving as many requests as it can. Retry in a few seconds.</p>"
)


def _busy(path: str, message: str, page: str, retry_after_s: int) -> HttpResponse:
    if path.startswith("/api/"):
        response = JsonResponse(error_body("busy", message), status=503)
    else:
        response = HttpResponse(page, status=503, content_type="text/html; charset=utf-8")
    response["Retry-After"] = str(retry_after_s)
    return response


class DependencyDownMiddleware:
    """Turn a view's PostgreSQL or Redis connection failure into 503 + Retry-After."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        return self.get_response(request)

    def process_exception(self, request, exc):
        if not isinstance(exc, _DOWN):
            return None
        log.warning("dependency down during %s %s: %s", request.method, request.path, exc)
        message = "A service the portal depends on is not answering; retry in a few seconds."
        return _busy(request.path, message, _PAGE, RETRY_AFTER_S)


class QueueWaitMiddleware:
    """Refuse a request that waited longer than WEB_QUEUE_WAIT_S for its turn in this worker.

    A worker runs its requests' Django code on WEB_THREADS threads, so under a burst the admitted
    ones queue; answering the stale ones 503 at once keeps the wait of those served bounded, and the
    client's retry lands when there is room. First in MIDDLEWARE: it runs when the turn comes.
    """

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        admitted_at = request.META.get(ADMITTED_AT)
        if admitted_at is not None and time.monotonic() - admitted_at > settings.WEB_QUEUE_WAIT_S:
            return _busy(request.path, _FULL_MESSAGE, _FULL_PAGE, settings.WEB_RETRY_AFTER_S)
        return self.get_response(request)


class AdmissionLimit:
    """ASGI wrapper: at most `limit` HTTP requests in this process at once; the rest get 503 now.

    The refusal is written here, before Django, a database connection or a thread is involved,
    so it stays cheap however hard the portal is pushed.
    """

    def __init__(self, app, *, limit: int, retry_after_s: int):
        self.app = app
        self.limit = limit
        self.retry_after_s = retry_after_s
        self.inflight = 0

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        if self.inflight >= self.limit:
            return await self._refuse(scope, send)
        self.inflight += 1
        try:
            return await self.app({**scope, ADMITTED_AT: time.monotonic()}, receive, send)
        finally:
            self.inflight -= 1

    async def _refuse(self, scope, send) -> None:
        if scope["path"].startswith("/api/"):
            body = json.dumps(error_body("busy", _FULL_MESSAGE)).encode()
            content_type = b"application/json"
        else:
            body, content_type = _FULL_PAGE.encode(), b"text/html; charset=utf-8"
        headers = [
            (b"content-type", content_type),
            (b"content-length", str(len(body)).encode()),
            (b"retry-after", str(self.retry_after_s).encode()),
        ]
        await send({"type": "http.response.start", "status": 503, "headers": headers})
        await send({"type": "http.response.body", "body": body})


class DependencyDownAsgi:
    """ASGI wrapper for what Django's middleware does not see (the session proxy, websockets):
    PostgreSQL or Redis failing before an answer started is 503 + Retry-After, never a 500.
    A websocket handshake is refused with an HTTP 503 where the server can send one (the ASGI
    `websocket.http.response` extension), else closed with 1013 ("try again later")."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        started = False

        async def tracking_send(message):
            nonlocal started
            started = True
            await send(message)

        try:
            return await self.app(scope, receive, tracking_send)
        except _DOWN as exc:
            log.warning("dependency down during %s %s: %s", scope["type"], scope.get("path"), exc)
            if started:
                if scope["type"] == "websocket":
                    await send({"type": "websocket.close", "code": 1013})
                return None
            await _busy_asgi(scope, send)


async def _busy_asgi(scope, send) -> None:
    body, content_type = _PAGE.encode(), b"text/html; charset=utf-8"
    if scope.get("path", "").startswith("/api/"):
        message = "A service the portal depends on is not answering; retry in a few seconds."
        body, content_type = json.dumps(error_body("busy", message)).encode(), b"application/json"
    headers = [
        (b"content-type", content_type),
        (b"content-length", str(len(body)).encode()),
        (b"retry-after", str(RETRY_AFTER_S).encode()),
    ]
    if scope["type"] == "http":
        await send({"type": "http.response.start", "status": 503, "headers": headers})
        await send({"type": "http.response.body", "body": body})
    elif "websocket.http.response" in scope.get("extensions", {}):
        await send({"type": "websocket.http.response.start", "status": 503, "headers": headers})
        await send({"type": "websocket.http.response.body", "body": body})
    else:
        await send({"type": "websocket.close", "code": 1013})
