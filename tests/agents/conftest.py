"""Fixtures for the node agent's tests: a stand-in portal and agents on simulated GPUs."""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import signal
import subprocess
import sys
import threading
import zlib
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from agents import confine, protocol
from agents.agent import Agent
from agents.simulate import SimulatedBackend
from tests import agent_cycles

TOKEN = "node-token-1"
HOSTNAME = "sim-node"

_BODIES = {
    protocol.REGISTER_PATH: protocol.RegisterRequest,
    protocol.READINGS_PATH: protocol.ReadingsRequest,
    protocol.EVENTS_PATH: protocol.EventsRequest,
}


class StandInPortal:
    """A tiny in-process portal that validates with agents.protocol and records everything."""

    def __init__(self, enforcement: str = "report") -> None:
        self.port = 0
        self.register_answer = {
            "node": HOSTNAME,
            "report_interval_s": 0,
            "sync_interval_s": 0,
            "enforcement": enforcement,
        }
        self.desired = {"generation": 1, "bookings": []}
        self.received: list[tuple[str, str, object]] = []
        self.status_override: int | None = None
        # Where the suite user's batch jobs run (and write gpu-portal-<id>.out) unless a test
        # says otherwise: never the home directory of the user running the suite.
        self.workdir: str | None = None
        self._server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), _handler(self))
        self.port = self._server.server_address[1]
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def paths(self) -> list[str]:
        return [path for _, path, _ in self.received]

    def events(self) -> list[protocol.Event]:
        return [
            e
            for p, path, body in self.received
            if path == protocol.EVENTS_PATH
            for e in body.events
        ]

    def book(self, booking_id, owner, uuids, command=None, minutes=60, generation=None, **more):
        now = protocol.utcnow()
        if command and self.workdir and owner == pwd.getpwuid(os.geteuid()).pw_name:
            more.setdefault("workdir", self.workdir)
        self.desired["bookings"].append(
            {
                "booking_id": booking_id,
                "owner": owner,
                "device_uuids": uuids,
                "start": (now - timedelta(minutes=1)).isoformat(),
                "end": (now + timedelta(minutes=minutes)).isoformat(),
                "command": command,
                **more,
            }
        )
        self.desired["generation"] = generation or self.desired["generation"] + 1


def _handler(portal: StandInPortal):
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):  # keep test output clean
            pass

        def _answer(self, status: int, body: object) -> None:
            raw = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

        def _authorized(self) -> bool:
            if portal.status_override:
                self._answer(portal.status_override, {"error": "forced"})
                return False
            if self.headers.get("Authorization") != f"Bearer {TOKEN}":
                self._answer(401, {"error": "bad token"})
                return False
            return True

        def do_GET(self):
            if self._authorized():
                portal.received.append(("GET", self.path, None))
                self._answer(200, portal.desired)

        def do_POST(self):
            if not self._authorized():
                return
            raw = self.rfile.read(int(self.headers["Content-Length"]))
            body = protocol.from_json(_BODIES[self.path], raw)
            portal.received.append(("POST", self.path, body))
            if self.path == protocol.REGISTER_PATH:
                self._answer(200, portal.register_answer)
            else:
                count = len(getattr(body, "readings", getattr(body, "events", [])))
                self._answer(202, {"accepted": count})

    return Handler


@pytest.fixture
def portal(tmp_path):
    stand_in = StandInPortal()
    stand_in.workdir = str(tmp_path / "work")
    os.makedirs(stand_in.workdir)
    stand_in.start()
    yield stand_in
    try:
        stand_in.stop()
    except Exception:
        pass


@pytest.fixture
def make_agent(portal, tmp_path, request):
    """Build agents on simulated GPUs against the stand-in portal; cleans up after them.

    Each test gets its own hostname, hence its own device UUIDs, so a process another
    test left behind can never show up on this test's devices; the checkout's path is part of
    it, so two checkouts' suites running side by side never see each other's jobs either.
    """
    agents = []
    key = f"{request.config.rootpath}:{request.node.nodeid}"
    hostname = f"{HOSTNAME}-{zlib.crc32(key.encode()):08x}"

    def make(spec="2xH100-80GB", **kwargs):
        kwargs.setdefault("state_dir", tmp_path / "state")
        kwargs.setdefault("hostname", hostname)
        kwargs.setdefault("push", False)
        kwargs.setdefault("grace_s", 1.0)
        kwargs.setdefault("min_uid", 0)  # the suite may run as root; its own test sets one
        backend = SimulatedBackend(
            spec, kwargs["hostname"], seed=1, device_dir=kwargs.pop("device_dir", None)
        )
        agent = Agent(portal.url, kwargs.pop("token", TOKEN), backend, **kwargs)
        agent.start()
        agents.append(agent)
        return agent

    yield make
    for agent in agents:
        agent.backend.close()
        for job in agent.dispatcher.jobs.values():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(job.pgid, signal.SIGKILL)
            confine.release(job.confinement)
        getattr(agent.confinement, "close", lambda: None)()


@pytest.fixture
def spawn():
    """Start helper processes (e.g. a foreign `sleep`) and make sure they die afterwards."""
    procs = []

    def start(args, cuda_devices=None, user=None, **kwargs):
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
        if cuda_devices:
            env["CUDA_VISIBLE_DEVICES"] = cuda_devices
        proc = subprocess.Popen(args, env=env, user=user, start_new_session=True, **kwargs)
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.fixture
def cycle_until():
    """Run agent cycles until `condition()` holds; fail the test after `timeout_s`."""
    return agent_cycles.cycle_until


@pytest.fixture
def me():
    """The Unix user running the tests: booking owners whose jobs need no user switch."""
    return pwd.getpwuid(os.geteuid()).pw_name


@pytest.fixture
def as_root():
    """Skip unless root: the test switches to the `nobody` user, as the agent does on nodes."""
    if os.geteuid() != 0:
        pytest.skip("needs root to run processes as another user")


@pytest.fixture
def agent_argv(portal, tmp_path):
    """The command line of a real agent process on one simulated H100 at the stand-in."""

    def argv(*extra, token=TOKEN):
        base = f"-m agents --portal {portal.url} --simulate 1xH100-80GB --no-push --min-uid 0"
        return [
            sys.executable,
            *base.split(),
            "--token",
            token,
            "--state-dir",
            str(tmp_path),
            *extra,
        ]

    return argv
