"""HTTP through Django's WSGI handler on a few threads, inside the ASGI server that runs websockets.

Every HTTP view of the portal is synchronous. Under Django's ASGI handler each request crosses from
the event loop to a thread and back several times (sync middleware around an async core around a
sync view), and one thread runs all of a process's requests. Measured on the portal, a light API
request cost about 7.6 ms of CPU that way and 4.5 ms through the WSGI handler. So uvicorn keeps
the sockets, the websockets (Channels) and the admission limit on its event loop, and each HTTP
request makes one trip to a thread of this pool, where Django runs it exactly as under a WSGI
server. Threads overlap one request's PostgreSQL waits with another's work.
"""

import asyncio
import io
import sys
from concurrent.futures import ThreadPoolExecutor

# A request body larger than this is refused before it is read into memory (agents' batches and
# API bodies are far smaller).
MAX_BODY_BYTES = 16 * 1024 * 1024
ADMITTED_AT = "portal.admitted_at"


class WsgiOnThreads:
    """An ASGI app (HTTP only) that runs a WSGI app on a pool of `threads` threads."""

    def __init__(self, wsgi_app, *, threads: int):
        self.wsgi_app = wsgi_app
        self.executor = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="http")

    async def __call__(self, scope, receive, send):
        body = await _read_body(receive)
        if body is None:
            await _send(send, 413, [(b"content-type", b"text/plain")], b"Request body too large.")
            return
        environ = _environ(scope, body)
        loop = asyncio.get_running_loop()
        status, headers, content = await loop.run_in_executor(self.executor, self._run, environ)
        await _send(send, status, headers, content)

    def _run(self, environ: dict) -> tuple[int, list, bytes]:
        started: dict = {}
        chunks: list[bytes] = []

        def start_response(status: str, headers: list, exc_info=None):
            started["status"] = int(status.split(" ", 1)[0])
            started["headers"] = [
                (k.lower().encode("latin1"), v.encode("latin1")) for k, v in headers
            ]
            return chunks.append

        result = self.wsgi_app(environ, start_response)
        try:
            chunks.extend(result)
        finally:
            # Django's response.close(): request_finished, which hands the connection back.
            if hasattr(result, "close"):
                result.close()
        return started["status"], started["headers"], b"".join(chunks)


async def _read_body(receive) -> bytes | None:
    body = bytearray()
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return bytes(body)
        body += message.get("body", b"")
        if len(body) > MAX_BODY_BYTES:
            return None
        if not message.get("more_body", False):
            return bytes(body)


async def _send(send, status: int, headers: list, body: bytes) -> None:
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def _environ(scope: dict, body: bytes) -> dict:
    """The WSGI environ (PEP 3333) of an ASGI HTTP scope."""
    server = scope.get("server") or ("localhost", 80)
    client = scope.get("client") or ("", 0)
    environ = {
        "REQUEST_METHOD": scope["method"],
        "SCRIPT_NAME": scope.get("root_path", "").encode().decode("latin1"),
        "PATH_INFO": scope["path"].encode().decode("latin1"),
        "QUERY_STRING": scope.get("query_string", b"").decode("latin1"),
        "SERVER_NAME": str(server[0]),
        "SERVER_PORT": str(server[1] or 80),
        "SERVER_PROTOCOL": f"HTTP/{scope.get('http_version', '1.1')}",
        "REMOTE_ADDR": client[0],
        "REMOTE_PORT": str(client[1]),
        "wsgi.version": (1, 0),
        "wsgi.url_scheme": scope.get("scheme", "http"),
        "wsgi.input": io.BytesIO(body),
        "wsgi.errors": sys.stderr,
        "wsgi.multithread": True,
        "wsgi.multiprocess": True,
        "wsgi.run_once": False,
    }
    if ADMITTED_AT in scope:
        environ[ADMITTED_AT] = scope[ADMITTED_AT]
    for raw_name, raw_value in scope.get("headers", []):
        name = raw_name.decode("latin1").upper().replace("-", "_")
        key = name if name in ("CONTENT_LENGTH", "CONTENT_TYPE") else f"HTTP_{name}"
        value = raw_value.decode("latin1")
        environ[key] = f"{environ[key]},{value}" if key in environ else value
    return environ
