"""The session proxy reaches only the address its node registered from (or a network the site
allows) and ports in SESSION_PORTS; a bad path is a 400 and a dependency down a 503, for HTTP
and websocket handshakes alike, never a 500 and never a request forwarded."""

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from asgiref.sync import async_to_sync
from channels.testing import HttpCommunicator
from django.test import Client

from agents import protocol
from portal.models import Booking, MigInstance, Node
from portal.services.booking.selectors import session_target
from tests.factories import make_active_booking
from tests.portal.test_connection_pool import pool_exhausted
from tests.portal_agent.conftest import AgentClient
from tests.portal_agent.test_agent_api import REGISTER


class _Upstream:
    """A loopback HTTP server standing for a session server; it counts what reaches it."""

    def __init__(self):
        self.paths: list[str] = []
        upstream = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                upstream.paths.append(self.path)
                self.send_response(200)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_port
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def upstream(settings):
    found = _Upstream()
    settings.SESSION_PORTS = (1024, 65535)  # the listener's port, wherever the kernel put it
    yield found
    found.close()


def _running(alice, node_a, *, host="127.0.0.1", port=41999) -> Booking:
    mig = MigInstance.objects.filter(gpu__node=node_a[0], profile="2g.20gb").first()
    booking = make_active_booking([mig], owner=alice, interactive="jupyterlab")
    Booking.objects.filter(pk=booking.pk).update(
        session_token="tok-" + "x" * 40,
        session_state="running",
        session_host=host,
        session_port=port,
    )
    return booking


def _http(user, path: str):
    from portal.consumers.sessions import SessionHttpProxy

    async def run():
        communicator = HttpCommunicator(SessionHttpProxy.as_asgi(), "GET", path)
        communicator.scope["user"] = user
        return await communicator.get_response(timeout=10)

    return async_to_sync(run)()


def _event(kind: str, booking_id: int, **fields) -> dict:
    return {"kind": kind, "time": protocol.utcnow().isoformat(), "booking_id": booking_id} | fields


@pytest.mark.django_db
def test_it_records_the_address_a_node_registered_from(node_a):
    agent = AgentClient(node_a[1])
    agent.http.defaults["REMOTE_ADDR"] = "10.20.0.7"
    assert agent.post(protocol.REGISTER_PATH, REGISTER).status_code == 200
    assert Node.objects.get(pk=node_a[0].pk).registered_from == "10.20.0.7"


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("host", "port", "why"),
    [
        ("10.9.9.9", 41999, "not the node's registered address"),
        ("127.0.0.1", 5432, "outside SESSION_PORTS"),
        ("127.0.0.1", 6379, "outside SESSION_PORTS"),
    ],
)
def test_it_refuses_a_session_address_the_node_may_not_point_at(alice, node_a, host, port, why):
    mig = MigInstance.objects.filter(gpu__node=node_a[0], profile="2g.20gb").first()
    booking = make_active_booking([mig], owner=alice, interactive="jupyterlab")
    where = {"session_host": host, "session_port": port, "pid": 7}
    assert AgentClient(node_a[1]).events(_event("started", booking.pk, **where)).status_code == 202
    booking.refresh_from_db()
    assert booking.session_state == "failed" and why in booking.session_detail
    assert (booking.session_host, booking.session_port) == ("", None)
    assert not session_target(user=alice, booking_id=booking.pk).running


@pytest.mark.django_db(transaction=True)
def test_it_forwards_nothing_to_a_stored_target_outside_the_rule(alice, node_a, upstream, settings):
    booking = _running(alice, node_a, port=upstream.port)
    assert _http(alice, f"/sessions/{booking.pk}/lab")["status"] == 200
    assert upstream.paths == [f"/sessions/{booking.pk}/lab"]
    settings.SESSION_PORTS = (upstream.port + 1, 65535)
    refused = _http(alice, f"/sessions/{booking.pk}/lab")
    assert refused["status"] == 410 and b"does not connect there" in refused["body"]
    Node.objects.filter(pk=node_a[0].pk).update(
        registered_from="10.20.0.7"
    )  # registered elsewhere now
    settings.SESSION_PORTS = (1024, 65535)
    assert _http(alice, f"/sessions/{booking.pk}/lab")["status"] == 410
    settings.SESSION_ALLOWED_NETWORKS = ["127.0.0.0/8"]  # a site network for sessions
    assert _http(alice, f"/sessions/{booking.pk}/lab")["status"] == 200
    assert len(upstream.paths) == 2


@pytest.mark.django_db(transaction=True)
def test_it_answers_400_for_a_path_that_would_split_the_upstream_request(alice, node_a, upstream):
    booking = _running(alice, node_a, port=upstream.port)
    response = _http(alice, f"/sessions/{booking.pk}/lab%0d%0aX-Injected:%20yes")
    assert response["status"] == 400
    assert upstream.paths == []


def _session_cookie(user) -> list[tuple[bytes, bytes]]:
    client = Client()
    client.force_login(user)
    cookie = client.cookies["sessionid"].value
    return [(b"cookie", f"sessionid={cookie}".encode()), (b"host", b"testserver")]


@pytest.mark.django_db(transaction=True)
def test_it_answers_503_to_a_session_request_when_no_database_connection_is_free(alice, node_a):
    from portal.asgi import _http_or_sessions

    booking = _running(alice, node_a)
    headers = _session_cookie(alice)

    async def get():
        communicator = HttpCommunicator(
            _http_or_sessions, "GET", f"/sessions/{booking.pk}/lab", headers=headers
        )
        return await communicator.get_response(timeout=20)

    with pool_exhausted():
        response = async_to_sync(get)()
    assert response["status"] == 503
    assert dict(response["headers"])[b"retry-after"] == b"5"


class _HandshakeRecorder:
    """The ASGI server's side of one websocket handshake: what the app answered."""

    def __init__(self, path: str, headers):
        self.scope = {
            "type": "websocket",
            "path": path,
            "raw_path": path.encode(),
            "query_string": b"",
            "headers": headers,
            "subprotocols": [],
            "client": ("127.0.0.1", 50000),
            "server": ("testserver", 80),
            "extensions": {"websocket.http.response": {}},
        }
        self.sent: list[dict] = []

    async def run(self, app):
        received = [{"type": "websocket.connect"}]

        async def receive():
            return received.pop(0) if received else {"type": "websocket.disconnect", "code": 1000}

        async def send(message):
            self.sent.append(message)

        await app(self.scope, receive, send)
        return self.sent


def _redis_away(settings) -> None:
    layer = settings.CHANNEL_LAYERS["default"]
    config = {**layer.get("CONFIG", {}), "hosts": ["redis://127.0.0.1:1/0"]}
    settings.CHANNEL_LAYERS = {"default": {**layer, "CONFIG": config}}


@pytest.mark.django_db(transaction=True)
def test_it_refuses_the_agents_websocket_with_503_when_redis_is_away(node_a, settings):
    from portal.asgi import _websockets

    _redis_away(settings)
    headers = [(b"authorization", f"Bearer {node_a[1]}".encode())]
    sent = async_to_sync(_HandshakeRecorder("/ws/agent/", headers).run)(_websockets)
    assert sent[0]["type"] == "websocket.http.response.start" and sent[0]["status"] == 503
    assert (b"retry-after", b"5") in sent[0]["headers"]


@pytest.mark.django_db(transaction=True)
def test_it_refuses_the_live_websocket_with_503_when_redis_is_away(alice, settings):
    from portal.asgi import _browser_websockets
    from portal.middleware import DependencyDownAsgi

    # Past the origin check (its allowed hosts are read once, when portal.asgi is imported).
    app = DependencyDownAsgi(_browser_websockets.application)
    _redis_away(settings)
    sent = async_to_sync(_HandshakeRecorder("/ws/live/", _session_cookie(alice)).run)(app)
    assert sent[0]["type"] == "websocket.http.response.start" and sent[0]["status"] == 503
