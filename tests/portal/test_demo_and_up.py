"""The README's first command: `manage.py up` gives a running portal with the seeded demo."""

import contextlib
import json
import os
import socket
import sqlite3
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from django.conf import settings
from django.core.management import call_command

from portal.models import Gpu, MigInstance, Node, Project, Quota
from portal.services.reporting.demo import (
    DEMO_BORROWED,
    DEMO_PASSWORD,
    DEMO_RUNNING,
    DEMO_WAITING,
)
from tests.process_tree import command, descendants, exit_status, living

ROOT = Path(settings.BASE_DIR)


@pytest.mark.django_db
def test_it_seeds_the_demo_idempotently():
    call_command("seed_demo", verbosity=0)
    call_command("seed_demo", verbosity=0)
    assert Node.objects.count() == 3
    assert Gpu.objects.count() == 24
    assert Gpu.objects.filter(mig_mode=True).count() == 4
    assert MigInstance.objects.count() == 16
    assert sorted(Project.objects.values_list("slug", flat=True)) == ["nlp", "vision"]
    assert Quota.objects.count() == 2


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _json(url: str, body: dict | None = None, token: str = "") -> dict:
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Token {token}"
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=10) as r:
            return json.loads(r.read())
    except urllib.error.HTTPError as exc:
        raise AssertionError(f"{exc.code} from {url}: {exc.read().decode()}") from exc


def _wait(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            last = predicate()
            if last:
                return last
        except OSError as exc:
            last = exc
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}; last: {last!r}")


def embedded_env(tmp_path) -> dict:
    """The environment of the README's first command: no database or Redis URL (embedded mode),
    a fresh var dir under `tmp_path`."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("DJANGO_SETTINGS_MODULE", "DATABASE_URL", "REDIS_URL", "DEBUG")
    }
    env.update(
        PORTAL_VAR_DIR=str(tmp_path / "var"), SCHEDULER_PASS_INTERVAL_S="1", PYTHONUNBUFFERED="1"
    )
    return env


@pytest.fixture
def embedded_portal(tmp_path):
    """`manage.py up` on SQLite in a fresh var dir, as the README's first command runs it."""
    port = _free_port()
    env = embedded_env(tmp_path)
    log = open(tmp_path / "up.log", "w+")
    process = subprocess.Popen(
        [sys.executable, "manage.py", "up", "--port", str(port)],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    (tmp_path / "up.pid").write_text(str(process.pid))
    base = f"http://127.0.0.1:{port}"
    try:
        _wait(
            lambda: urllib.request.urlopen(f"{base}/accounts/login/", timeout=5).status == 200,
            120,
            "the server",
        )
        yield base, tmp_path / "up.log"
    finally:
        _terminate(process)
        log.seek(0)
        print(log.read()[-5000:])


def _terminate(process: subprocess.Popen, timeout_s: float = 30) -> float:
    """SIGTERM the whole group as a service manager would; seconds until `up` exited."""
    started = time.monotonic()
    with contextlib.suppress(ProcessLookupError):  # a test may have stopped it already
        os.killpg(process.pid, 15)
    try:
        process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, 9)
        process.wait(timeout=30)
        raise AssertionError(f"up ignored SIGTERM for {timeout_s} s") from None
    return time.monotonic() - started


def test_it_runs_the_embedded_demo_with_live_simulated_nodes(embedded_portal):
    base, log_path = embedded_portal
    # The banner comes once the server listens, a moment after its first answer on a busy machine.
    banner = _wait(
        lambda: "GPU Portal running at" in (text := log_path.read_text()) and text, 30, "the banner"
    )
    assert "GPU Portal running at http://127.0.0.1:" in banner and DEMO_PASSWORD in banner
    token = _json(f"{base}/api/v1/auth/token/", {"username": "alice", "password": DEMO_PASSWORD})[
        "token"
    ]
    nodes = _wait(
        lambda: (
            [
                n
                for n in _json(f"{base}/api/v1/nodes/", token=token)["results"]
                if n["state"] == "up"
            ]
            if len(
                [
                    n
                    for n in _json(f"{base}/api/v1/nodes/", token=token)["results"]
                    if n["state"] == "up"
                ]
            )
            == 3
            else None
        ),
        60,
        "three simulated nodes to report",
    )
    assert sorted(n["hostname"] for n in nodes) == ["gpu-a01", "gpu-a02", "gpu-a03"]
    # Their cores and host memory, as their agents registered them (a DGX H100, A100 servers).
    assert {n["hostname"]: (n["cpus"], n["memory_mib"]) for n in nodes} == {
        "gpu-a01": (112, 2 * 1024 * 1024),
        "gpu-a02": (128, 1024 * 1024),
        "gpu-a03": (128, 1024 * 1024),
    }
    # The banner comes once the server listens and stays the last thing on the console: no
    # agent retrying a closed port before it, no per-task or per-request lines after it.
    console = log_path.read_text().strip().splitlines()
    assert console[-1].strip().startswith("demo logins:"), console
    assert console[-3].startswith("GPU Portal running at"), console
    assert not any("Connection refused" in line or "succeeded in" in line for line in console)
    static = urllib.request.urlopen(
        f"{base}/static/drf_spectacular_sidecar/swagger-ui-dist/swagger-ui.css"
    )
    assert static.status == 200


def test_it_runs_a_queued_batch_booking_on_a_simulated_node_end_to_end(embedded_portal):
    base, _ = embedded_portal
    token = _json(f"{base}/api/v1/auth/token/", {"username": "bob", "password": DEMO_PASSWORD})[
        "token"
    ]
    _wait(
        lambda: (
            sum(n["state"] == "up" for n in _json(f"{base}/api/v1/nodes/", token=token)["results"])
            == 3
        ),
        60,
        "the simulated nodes",
    )
    booking = _json(
        f"{base}/api/v1/bookings/",
        {
            "gpus": 2,
            "gpu_model": "A100-80GB",
            "duration_s": 600,
            "command": "echo hello from $CUDA_VISIBLE_DEVICES",
        },
        token,
    )
    url = f"{base}/api/v1/bookings/{booking['id']}/"
    done = _wait(
        lambda: (b := _json(url, token=token))["state"] in ("finished", "failed") and b,
        60,
        "the batch command to run and exit",
    )
    assert done["state"] == "finished", done
    assert done["exit_code"] == 0
    assert done["log_tail"].startswith("hello from GPU-")
    assert done["log_tail"].count("GPU-") == 2


def test_it_runs_a_rendezvous_across_two_demo_nodes(embedded_portal):
    """The demo's 16-GPU booking on two simulated nodes: both ranks meet and finish."""
    base, _ = embedded_portal
    login = {"username": "bob", "password": DEMO_PASSWORD}
    token = _json(f"{base}/api/v1/auth/token/", login)["token"]
    _wait(
        lambda: (
            sum(n["state"] == "up" for n in _json(f"{base}/api/v1/nodes/", token=token)["results"])
            == 3
        ),
        60,
        "the simulated nodes",
    )
    # The demo opens with a queue that holds GPUs on both 8-GPU nodes for hours: the admin
    # clears it (cancel), as a site would for a demonstration, so the two nodes are free.
    admin = {"username": "admin", "password": DEMO_PASSWORD}
    admin_token = _json(f"{base}/api/v1/auth/token/", admin)["token"]
    # Running, the outsider's short one before the weekly class, the reservation, waiting, and
    # carol's borrowed A100s.
    queue = len(DEMO_RUNNING) + 1 + 1 + len(DEMO_WAITING) + len(DEMO_BORROWED)

    def seeded():
        found = _json(f"{base}/api/v1/bookings/?page_size=100", token=admin_token)["results"]
        ids = [b["id"] for b in found if b["state"] in ("active", "pending", "planned")]
        return ids if len(ids) == queue else None

    seeded = _wait(seeded, 90, "the demo's whole queue")
    for booking_id in seeded:
        _json(f"{base}/api/v1/bookings/{booking_id}/cancel/", {}, admin_token)
    rendezvous = ROOT / "docs" / "examples" / "rendezvous.py"
    # The demo's two 8-GPU nodes are of two models: any will do (else one model is kept).
    body = {
        "node_count": 2,
        "mixed_models": True,
        "duration_s": 600,
        "command": f"{sys.executable} {rendezvous}",
    }
    booking = _json(f"{base}/api/v1/bookings/", body, token)
    url = f"{base}/api/v1/bookings/{booking['id']}/"
    done = _wait(
        lambda: (b := _json(url, token=token))["state"] in ("finished", "failed") and b,
        90,
        "both ranks to meet and exit",
    )
    assert (done["state"], done["state_detail"]) == ("finished", "all 2 nodes exited with code 0")
    assert [(n["rank"], n["exit_code"]) for n in done["nodes"]] == [(0, 0), (1, 0)]
    for node in done["nodes"]:
        assert node["log_tail"] == f"rank {node['rank']} of 2 nodes (16 GPUs) met ranks 0,1\n"


def test_it_stops_on_sigterm_while_a_request_is_in_flight(embedded_portal):
    """The server stops its event loop while a request thread still needs it: `up` must exit."""
    base, log_path = embedded_portal
    up_pid = int(log_path.with_name("up.pid").read_text())
    answers = []
    database = sqlite3.connect(log_path.parent / "var" / "portal.sqlite3", timeout=30)
    database.execute("BEGIN IMMEDIATE")  # the token request below waits for this write lock
    request = threading.Thread(
        target=lambda: answers.append(
            _status(f"{base}/api/v1/auth/token/", {"username": "alice", "password": DEMO_PASSWORD})
        ),
        daemon=True,
    )
    request.start()
    time.sleep(1.5)
    os.killpg(up_pid, 15)  # the agents' websockets close at once, the token request cannot yet
    time.sleep(1.5)
    database.rollback()
    database.close()
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and _alive(up_pid):
        time.sleep(0.2)
    assert not _alive(up_pid), f"up ignored SIGTERM; answers so far: {answers}"


def _status(url: str, body: dict) -> int | str:
    try:
        _json(url, body)
        return 200
    except (AssertionError, OSError) as exc:
        return str(exc)


def _alive(pid: int) -> bool:
    try:
        finished, _ = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return False
    return finished == 0


@pytest.mark.parametrize("signum", [15, 2], ids=["SIGTERM", "SIGINT"])
def test_it_stops_its_agents_and_their_jobs_when_up_is_stopped(embedded_portal, signum):
    """A signal to `up` alone (a service manager's SIGTERM, a Ctrl-C) leaves nothing running."""
    base, log_path = embedded_portal
    up_pid = int(log_path.with_name("up.pid").read_text())
    token = _json(f"{base}/api/v1/auth/token/", {"username": "bob", "password": DEMO_PASSWORD})[
        "token"
    ]
    booking = _json(
        f"{base}/api/v1/bookings/",
        {"gpus": 1, "duration_s": 600, "command": "sleep 600 & sleep 600; wait"},
        token,
    )
    assert booking["state"] in ("pending", "planned", "active"), booking
    # Agents, their jobs and the jobs' children, each with its start time against pid reuse.
    tree = _wait(lambda: _with_job(descendants(up_pid)), 60, "the job under an agent")
    os.kill(up_pid, signum)  # up alone: its children must hear it from up
    status = _wait(lambda: exit_status(up_pid), 20, "up to exit")
    assert status == [0], status
    with contextlib.suppress(AssertionError):
        _wait(lambda: not living(tree), 10, "every descendant of up to exit")
    assert living(tree) == [], "still running after up exited"
    assert "Traceback" not in log_path.read_text()


def _with_job(found: dict[int, str]) -> dict[int, str] | None:
    """The descendants once the job (`sleep 600` twice) runs among them."""
    return found if sum("sleep 600" in command(pid) for pid in found) >= 2 else None


# The demo's console keeps to the banner: a short session of `manage.py up` (agents register, the
# demo's queue runs, a visitor's batch command runs, mails go out), then `up` stops; the console
# holds the seed line and the banner, nothing else.
BANNER_LINES = 4  # "Demo ready: ...", then the three lines of the banner


@pytest.fixture
def quiet_env(monkeypatch):
    # The console as a user sees it: no LOG_LEVEL of the test run's own.
    monkeypatch.delenv("LOG_LEVEL", raising=False)


def test_it_keeps_the_console_of_a_demo_session_to_the_banner(quiet_env, embedded_portal):
    base, log_path = embedded_portal
    token = _json(f"{base}/api/v1/auth/token/", {"username": "admin", "password": DEMO_PASSWORD})[
        "token"
    ]
    # The demo opens with its queue once the agents have registered.
    queue = _wait(
        lambda: (
            (rows := _rows(f"{base}/api/v1/bookings/?state=pending&state=active", token))
            and sum(b["state"] == "pending" for b in rows) >= 2
            # and the pass that follows the agents' registration has planned them
            and all(b["pending_reason"] for b in rows if b["state"] == "pending")
            and rows
        ),
        90,
        "the demo's queue",
    )
    assert any(b["state"] == "active" for b in queue)
    # Those that wait wait for devices (carol's over-quota A100s start borrowed: up turns
    # QUOTA_BORROWING on), each with its reason.
    reasons = {b["pending_reason"] for b in queue if b["state"] == "pending"}
    assert reasons and reasons <= {"resources", "reservation", "priority"}, reasons
    assert any(b["borrowed"] for b in queue if b["state"] == "active")
    bob = _json(f"{base}/api/v1/auth/token/", {"username": "bob", "password": DEMO_PASSWORD})
    _json(
        f"{base}/api/v1/bookings/",
        {"gpus": 1, "gpu_model": "A100-80GB", "duration_s": 600, "command": "echo done"},
        bob["token"],
    )
    _wait(
        lambda: _rows(f"{base}/api/v1/bookings/?state=finished", token),
        60,
        "the batch command to run",
    )
    mail = log_path.parent / "var" / "mail"
    _wait(lambda: len(os.listdir(mail)) >= 4, 30, "the demo's mails in their folder")
    up_pid = int(log_path.with_name("up.pid").read_text())
    os.killpg(up_pid, 15)
    _wait(lambda: "Traceback" in log_path.read_text() or _gone(up_pid), 30, "up to stop")

    console = [line for line in log_path.read_text().splitlines() if line.strip()]
    assert len(console) == BANNER_LINES, "\n".join(console)
    assert console[0].startswith("Demo ready:") and console[1].startswith("GPU Portal running at")


def _rows(url: str, token: str) -> list:
    """The list's results; none while the portal answers busy (503, retry), as it may while
    the demo's queue is being made on SQLite."""
    try:
        return _json(url, token=token)["results"]
    except AssertionError as exc:
        if str(exc).startswith("503 "):
            return []
        raise


def _gone(pid: int) -> bool:
    try:
        os.waitpid(pid, os.WNOHANG)
        os.kill(pid, 0)
    except (ChildProcessError, ProcessLookupError):
        return True
    return False
