"""Real servers on loopback for the notification tests: SMTP (aiosmtpd) and HTTP receivers."""

import json
import socket
import threading
import time
from email import message_from_bytes, policy
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from aiosmtpd.controller import Controller


class _Inbox:
    def __init__(self):
        self.messages = []

    async def handle_DATA(self, server, session, envelope):
        self.messages.append(message_from_bytes(envelope.content, policy=policy.default))
        return "250 OK"


@pytest.fixture
def smtp(settings):
    """An SMTP server on loopback; the portal sends real mail to it."""
    inbox = _Inbox()
    with socket.socket() as probe:  # a free port (the controller's own start check needs one)
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    controller = Controller(inbox, hostname="127.0.0.1", port=port)
    controller.start()
    settings.EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
    settings.EMAIL_HOST = "127.0.0.1"
    settings.EMAIL_PORT = port
    yield inbox.messages
    controller.stop()


class Receiver:
    """A local HTTP server that records POSTs; it can fail first, or answer slowly."""

    def __init__(self):
        self.posts: list[dict] = []
        self.arrivals = 0  # requests received, counted before any delay
        self.fail_first = 0
        self.delay_s = 0.0
        self.answer = b"ok"
        self.redirect_to = ""  # answer 307 to there instead
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                receiver.arrivals += 1
                if receiver.fail_first > 0:
                    receiver.fail_first -= 1
                    self.send_response(500)
                    self.end_headers()
                    return
                if receiver.redirect_to:
                    self.send_response(307)
                    self.send_header("Location", receiver.redirect_to)
                    self.end_headers()
                    return
                time.sleep(receiver.delay_s)
                receiver.posts.append({"path": self.path, "headers": self.headers, "body": body})
                self.send_response(200)
                self.end_headers()
                self.wfile.write(receiver.answer)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def json(self, i: int = 0) -> dict:
        return json.loads(self.posts[i]["body"])

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(autouse=True)
def loopback_receivers_allowed(settings):
    """These tests' receivers listen on loopback over plain http: the site's own receivers,
    let through as a site would (tests/notifications/test_outbound.py takes this away)."""
    settings.NOTIFY_ALLOW_HTTP = True
    settings.NOTIFY_ALLOWED_NETWORKS = ["127.0.0.1/32"]


# The same for a Celery worker started by a test (tests/workers.py passes these on).
LOOPBACK_RECEIVERS_ENV = {"NOTIFY_ALLOW_HTTP": "true", "NOTIFY_ALLOWED_NETWORKS": "127.0.0.1/32"}


@pytest.fixture
def receiver():
    r = Receiver()
    yield r
    r.close()


@pytest.fixture
def owner(user):
    """The booking owner the messages go to: alice, alice@example.org (tests/conftest.py)."""
    return user
