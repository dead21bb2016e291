"""The reverse proxy from the owner's browser to an interactive session on a node.

`/sessions/<booking id>/...` over HTTP (SessionHttpProxy) and websockets (SessionWebsocketProxy):
authenticated by the portal session (Channels' AuthMiddlewareStack), for the booking's owner only
(anyone else, or an unknown id, gets the same 404 / refused handshake, so ids are not confirmed).
The session's token goes upstream in an Authorization header; the browser never sees it, and the
portal's own cookies never go upstream. The session server runs with this path as its base URL,
so nothing is rewritten. docs/interactive.md has the why.
"""

import asyncio
import contextlib
import html
import logging
import re
from urllib.parse import urlsplit

import httpx
import websockets
from channels.db import database_sync_to_async
from channels.generic.http import AsyncHttpConsumer
from channels.generic.websocket import AsyncWebsocketConsumer
from django.conf import settings
from websockets.asyncio.client import connect as websocket_connect

from portal.services.booking.selectors import SessionTarget, session_target

log = logging.getLogger(__name__)

PATH_RE = re.compile(r"^/sessions/(?P<booking_id>\d{1,18})/")
# Hop-by-hop headers (RFC 9110 7.6.1) and what the proxy sets itself.
_HOP = {
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "host",
    "authorization",
    "cookie",
    "origin",
}
# The proxy's own pages (not found, starting, ended): no script, one inline style.
_PAGE_POLICY = b"default-src 'none'; style-src 'unsafe-inline'; frame-ancestors 'none'"
_UPSTREAM_TIMEOUT = httpx.Timeout(connect=5.0, read=300.0, write=60.0, pool=5.0)
_WS_MAX_MESSAGE = 64 * 1024 * 1024


def _booking_id(scope) -> int | None:
    match = PATH_RE.match(scope.get("path", ""))
    return int(match["booking_id"]) if match else None


@database_sync_to_async
def _target(scope) -> SessionTarget | None:
    booking_id = _booking_id(scope)
    if booking_id is None:
        return None
    return session_target(user=scope.get("user"), booking_id=booking_id)


@database_sync_to_async
def _signed_in(scope) -> bool:
    return bool(getattr(scope.get("user"), "is_authenticated", False))


def _forward_headers(scope, target: SessionTarget) -> list[tuple[str, str]]:
    # The websocket client makes its own handshake (key, version, extensions, subprotocols).
    headers = [
        (name.decode("latin-1"), value.decode("latin-1"))
        for name, value in scope.get("headers", [])
        if name.decode("latin-1").lower() not in _HOP
        and name.lower() != b"content-length"  # the client sets it for the body it sends
        and not name.lower().startswith(b"sec-websocket-")
    ]
    cookies = _session_cookies(scope)
    if cookies:
        headers.append(("cookie", cookies))
    headers.append(("authorization", f"token {target.token}"))
    return headers


def _session_cookies(scope) -> str:
    # The session server's own cookies (set with its base URL as path) pass; the portal's
    # session and CSRF cookies must never reach a process that runs user code.
    own = {settings.SESSION_COOKIE_NAME, settings.CSRF_COOKIE_NAME}
    kept = []
    for name, value in scope.get("headers", []):
        if name.lower() != b"cookie":
            continue
        for part in value.decode("latin-1").split(";"):
            key = part.split("=", 1)[0].strip()
            if key and key not in own:
                kept.append(part.strip())
    return "; ".join(kept)


def _cross_site(scope) -> bool:
    # The proxy authenticates every request upstream with the token, which turns off Jupyter's
    # own XSRF check; SameSite session cookies already keep other sites out, and this keeps a
    # browser's unsafe request from another origin out too.
    if scope["method"] in ("GET", "HEAD", "OPTIONS"):
        return False
    headers = dict(scope.get("headers", []))
    origin = headers.get(b"origin", b"").decode("latin-1")
    if not origin:
        return False  # not a browser's cross-origin request (browsers send Origin on those)
    host = headers.get(b"host", b"").decode("latin-1")
    return urlsplit(origin).netloc != host and origin not in settings.CSRF_TRUSTED_ORIGINS


def _page(title: str, text: str, booking_id: int | None) -> bytes:
    back = f'<p><a href="/bookings/{booking_id}/">Back to the booking</a></p>' if booking_id else ""
    return (
        f"<!doctype html><html lang=en><meta charset=utf-8><title>{html.escape(title)}</title>"
        f"<body style='font-family:sans-serif;max-width:40em;margin:4em auto'>"
        f"<h1>{html.escape(title)}</h1><p>{html.escape(text)}</p>{back}</body></html>"
    ).encode()


# The proxy talks to no group: without a channel layer (get_channel_layer answers None for an
# alias not configured) a request costs no Redis round trips and no channel to clean up.
_NO_CHANNEL_LAYER = "interactive-sessions-use-no-channel-layer"


class SessionHttpProxy(AsyncHttpConsumer):
    """HTTP to a running session, streamed both ways (the request body is read first)."""

    channel_layer_alias = _NO_CHANNEL_LAYER

    async def handle(self, body: bytes) -> None:
        target = await _target(self.scope)
        if target is None:
            if not await _signed_in(self.scope):
                return await self._login_redirect()
            return await self._answer(404, "Not found", "No such session among yours.", None)
        if not target.running:
            return await self._not_running(target)
        if _cross_site(self.scope):
            return await self._answer(
                403, "Refused", "A cross-site request to a session.", target.booking_id
            )
        await self._forward(target, body)

    async def _forward(self, target: SessionTarget, body: bytes) -> None:
        query = self.scope.get("query_string", b"").decode("latin-1")
        url = f"http://{target.upstream}{self.scope['path']}" + (f"?{query}" if query else "")
        try:
            async with httpx.AsyncClient(timeout=_UPSTREAM_TIMEOUT) as client:
                request = client.build_request(
                    self.scope["method"],
                    url,
                    headers=_forward_headers(self.scope, target),
                    content=body,
                )
                response = await client.send(request, stream=True)
                try:
                    await self._relay(response)
                finally:
                    await response.aclose()
        except httpx.HTTPError as exc:
            log.warning("session %s: upstream %s failed: %s", target.booking_id, url, exc)
            await self._answer(
                502,
                "Session unreachable",
                "The session did not answer; try again.",
                target.booking_id,
            )

    async def _relay(self, response: httpx.Response) -> None:
        headers = [
            (name.encode("latin-1"), value.encode("latin-1"))
            for name, value in response.headers.multi_items()
            if name.lower() not in _HOP
        ]
        await self.send_headers(status=response.status_code, headers=headers)
        async for chunk in response.aiter_raw():
            await self.send_body(chunk, more_body=True)
        await self.send_body(b"")

    async def _not_running(self, target: SessionTarget) -> None:
        if target.state in ("starting", ""):
            return await self._answer(
                503,
                "Session starting",
                "The session is starting; reload in a moment.",
                target.booking_id,
            )
        title = "Session failed" if target.state == "failed" else "Session ended"
        detail = target.detail or "The session is no longer running."
        await self._answer(410, title, detail[:1].upper() + detail[1:] + ".", target.booking_id)

    async def _login_redirect(self) -> None:
        location = f"{settings.LOGIN_URL}?next={self.scope['path']}"
        await self.send_response(302, b"", headers=[(b"location", location.encode())])

    async def _answer(self, status: int, title: str, text: str, booking_id: int | None) -> None:
        headers = [
            (b"content-type", b"text/html; charset=utf-8"),
            (b"cache-control", b"no-store"),
            (b"content-security-policy", _PAGE_POLICY),
        ]
        if status == 503:
            headers.append((b"retry-after", b"2"))
        await self.send_response(status, _page(title, text, booking_id), headers=headers)


class SessionWebsocketProxy(AsyncWebsocketConsumer):
    """A websocket (kernel, terminal) to a running session: messages copied both ways."""

    channel_layer_alias = _NO_CHANNEL_LAYER

    upstream = None
    pump: asyncio.Task | None = None

    async def connect(self):
        target = await _target(self.scope)
        if target is None or not target.running:
            await self.close()  # before accept: the handshake is refused, the same for all
            return
        query = self.scope.get("query_string", b"").decode("latin-1")
        url = f"ws://{target.upstream}{self.scope['path']}" + (f"?{query}" if query else "")
        try:
            self.upstream = await websocket_connect(
                url,
                additional_headers=_forward_headers(self.scope, target),
                subprotocols=self.scope.get("subprotocols") or None,
                max_size=_WS_MAX_MESSAGE,
                open_timeout=10,
            )
        except (TimeoutError, OSError, websockets.WebSocketException) as exc:
            log.warning("session %s: upstream websocket failed: %s", target.booking_id, exc)
            await self.close()
            return
        await self.accept(subprotocol=self.upstream.subprotocol)
        self.pump = asyncio.create_task(self._pump())

    async def _pump(self) -> None:
        try:
            async for message in self.upstream:
                if isinstance(message, bytes):
                    await self.send(bytes_data=message)
                else:
                    await self.send(text_data=message)
        except websockets.WebSocketException:
            pass
        await self.close()

    async def receive(self, text_data=None, bytes_data=None):
        if self.upstream is None:
            return
        with contextlib.suppress(websockets.WebSocketException):
            await self.upstream.send(bytes_data if bytes_data is not None else text_data)

    async def disconnect(self, code):
        if self.pump is not None:
            self.pump.cancel()
        if self.upstream is not None:
            await self.upstream.close()
