"""A portal answering 503 + Retry-After (busy, or a dependency down): the client waits and
retries, then gives up with exit code 6. A loopback HTTP server stands in for a portal under load,
which the live test server cannot be made to be on demand."""

import json
import os
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
QUOTA = {"results": []}


@pytest.fixture
def busy_portal():
    """A server that answers 503 to the first `state["busy"]` requests, then the quota list."""
    state = {"busy": 0, "seen": 0}

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            state["seen"] += 1
            if state["seen"] <= state["busy"]:
                body = {"error": {"code": "busy", "message": "The portal is busy.", "fields": {}}}
                self._send(503, body, {"Retry-After": "0"})
            else:
                self._send(200, QUOTA, {})

        def _send(self, status, body, headers):
            raw = json.dumps(body).encode()
            self.send_response(status)
            for name, value in {"Content-Type": "application/json", **headers}.items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}", state
    server.shutdown()
    server.server_close()


def _quota(url: str, tmp_path: Path):
    env = os.environ | {
        "GPU_PORTAL_URL": url,
        "GPU_PORTAL_TOKEN": "gp-test",
        "XDG_CONFIG_HOME": str(tmp_path),
    }
    return subprocess.run(
        [sys.executable, "-m", "portal.cli", "quota", "--json"],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=60,
    )


def test_it_retries_a_busy_portal_after_its_retry_after(busy_portal, tmp_path):
    url, state = busy_portal
    state["busy"] = 2
    result = _quota(url, tmp_path)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == []
    assert state["seen"] == 3
    assert result.stderr.count("The portal is busy. Retrying in 0 s.") == 2


def test_it_gives_up_with_exit_6_when_the_portal_stays_busy(busy_portal, tmp_path):
    url, state = busy_portal
    state["busy"] = 100
    result = _quota(url, tmp_path)
    assert result.returncode == 6
    assert "The portal is busy. [busy]" in result.stderr
    assert state["seen"] == 4  # the first try and three retries
