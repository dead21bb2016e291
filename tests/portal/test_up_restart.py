"""`manage.py up` used, stopped and started again on the same install: it starts, the bookings and
the device ids survive (embedded on SQLite, and server mode with --demo on PostgreSQL)."""

import contextlib
import os
import subprocess
import sys
import urllib.request

import pytest
from django.conf import settings

from portal.services.reporting.demo import DEMO_PASSWORD
from tests.portal.test_demo_and_up import _free_port, _json, _terminate, embedded_env

ROOT = settings.BASE_DIR


def _start(env: dict, log_path, *args: str):
    """`manage.py up` in a process group of its own; (process, base url) once it serves."""
    port = _free_port()
    log = open(log_path, "a")
    process = subprocess.Popen(
        [sys.executable, "manage.py", "up", "--port", str(port), *args],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    base = f"http://127.0.0.1:{port}"
    _until(
        process,
        log_path,
        lambda: urllib.request.urlopen(f"{base}/accounts/login/", timeout=5).status == 200,
        180,
        "the server",
    )
    return process, base


def _until(process, log_path, predicate, timeout: float, what: str):
    """predicate()'s first truthy answer; fails at once, with up's console, if up exited."""
    import time

    deadline, last = time.monotonic() + timeout, None
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(
                f"up exited with {process.returncode} waiting for {what}:\n"
                + log_path.read_text()[-4000:]
            )
        try:
            if last := predicate():
                return last
        except (OSError, AssertionError) as exc:
            last = exc
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}; last: {last!r}")


def _devices(base: str, token: str) -> list[tuple]:
    rows = []
    for kind in ("gpus", "mig-instances"):
        body = _json(f"{base}/api/v1/{kind}/?page_size=500", token=token)
        rows += sorted((kind, row["id"], row["uuid"]) for row in body["results"])
    return rows


def _nodes_up(base: str, token: str) -> bool:
    nodes = _json(f"{base}/api/v1/nodes/", token=token)["results"]
    return sum(node["state"] == "up" for node in nodes) == 3


def _use_stop_and_start_again(env: dict, tmp_path, *args: str) -> None:
    log_path = tmp_path / "up.log"
    process, base = _start(env, log_path, *args)
    try:
        token = _json(f"{base}/api/v1/auth/token/", {"username": "bob", "password": DEMO_PASSWORD})[
            "token"
        ]
        _until(process, log_path, lambda: _nodes_up(base, token), 90, "the three agents")
        before = _devices(base, token)
        booking = _json(f"{base}/api/v1/bookings/", {"gpus": 2, "duration_s": 3600}, token)
        url = f"{base}/api/v1/bookings/{booking['id']}/"
        held = _until(
            process,
            log_path,
            lambda: (b := _json(url, token=token))["state"] == "active" and b,
            90,
            "the booking to start",
        )
    finally:
        _terminate(process)
    assert process.returncode == 0, log_path.read_text()[-4000:]

    process, base = _start(env, log_path, *args)  # the second start: exited 1 before
    try:
        _until(process, log_path, lambda: _nodes_up(base, token), 90, "the agents again")
        assert _devices(base, token) == before  # no device renumbered or replaced
        again = _json(f"{base}/api/v1/bookings/{booking['id']}/", token=token)
        assert again["id"] == booking["id"]
        assert [d["uuid"] for d in again["devices"]] == [d["uuid"] for d in held["devices"]]
        ids = {uuid: pk for kind, pk, uuid in before if kind == "gpus"}
        for device in held["devices"]:  # /gpus/<id>/ as linked before the restart
            gpu = _json(f"{base}/api/v1/gpus/{ids[device['uuid']]}/", token=token)
            assert gpu["uuid"] == device["uuid"]
    finally:
        _terminate(process)
        print(log_path.read_text()[-5000:])
    assert process.returncode == 0
    assert "ProtectedError" not in log_path.read_text()


def test_it_starts_the_embedded_demo_again_with_its_bookings_and_device_ids(tmp_path):
    _use_stop_and_start_again(embedded_env(tmp_path), tmp_path)


def _running(url: str, token: str) -> dict | None:
    """The booking once its command runs on a node (its agent reported the launch)."""
    booking = _json(url, token=token)
    runs = booking["nodes"]
    return (
        booking if booking["state"] == "active" and runs and runs[0]["state"] == "running" else None
    )


def _stop_a_running_job_and_start_again(env: dict, tmp_path, *args: str) -> None:
    """A batch job runs, with an afterok dependent waiting for it, when `up` stops (its agents
    kill their jobs). Started again, the portal must not say the job succeeded: it is back in
    the queue saying why (or failed so), and the dependent has not run."""
    # What the agent reports is under test, not the heartbeat: a slow restart must not let the
    # portal mark the nodes down first (that would requeue the job too, for another reason).
    env = {**env, "NODE_HEARTBEAT_TIMEOUT_S": "900"}
    log_path = tmp_path / "up.log"
    process, base = _start(env, log_path, *args)
    try:
        login = {"username": "bob", "password": DEMO_PASSWORD}
        token = _json(f"{base}/api/v1/auth/token/", login)["token"]
        _until(process, log_path, lambda: _nodes_up(base, token), 90, "the three agents")
        job = _json(
            f"{base}/api/v1/bookings/",
            {"gpus": 1, "duration_s": 3600, "command": "sleep 600"},
            token,
        )
        after = {"gpus": 1, "duration_s": 600, "command": "true", "after": f"afterok:{job['id']}"}
        dependent = _json(f"{base}/api/v1/bookings/", after, token)
        job_url = f"{base}/api/v1/bookings/{job['id']}/"
        _until(process, log_path, lambda: _running(job_url, token), 90, "the job to run")
    finally:
        _terminate(process)
    assert process.returncode == 0, log_path.read_text()[-4000:]

    process, base = _start(env, log_path, *args)
    try:
        _until(process, log_path, lambda: _nodes_up(base, token), 90, "the agents again")
        # What the portal did with the job, as its audit log keeps it (a requeued job may run
        # again by now, which clears the booking's own state_detail).
        admin = {"username": "admin", "password": DEMO_PASSWORD}
        admin_token = _json(f"{base}/api/v1/auth/token/", admin)["token"]
        audit = f"{base}/api/v1/audit/?action=booking.&target_id={job['id']}"
        ended = _until(
            process,
            log_path,
            lambda: [
                row
                for row in _json(audit, token=admin_token)["results"]
                if row["action"] in ("booking.requeue", "booking.fail")
            ],
            60,
            "the portal to hear of the job the agent stopped",
        )
        assert len(ended) == 1, ended
        detail = (ended[0]["after"] or {}).get("state_detail", "")
        assert "the node's agent stopped while it ran" in detail, ended
        again = _json(f"{base}/api/v1/bookings/{job['id']}/", token=token)
        assert again["state"] != "finished", again
        if ended[0]["action"] == "booking.requeue":
            assert again["restart_count"] == 1, again
        waited = _json(f"{base}/api/v1/bookings/{dependent['id']}/", token=token)
        assert waited["state"] == "pending" and waited["started_at"] is None, waited
    finally:
        _terminate(process)
        print(log_path.read_text()[-5000:])
    assert process.returncode == 0


def test_it_never_reports_a_job_killed_by_stopping_the_embedded_demo_as_a_success(tmp_path):
    _stop_a_running_job_and_start_again(embedded_env(tmp_path), tmp_path)


@pytest.fixture
def fresh_database(settings):
    import psycopg

    name = f"gpuportal_uprestart_{settings.TEST_RUN_ID}"
    admin = psycopg.connect("postgresql://postgres@127.0.0.1:5432/postgres", autocommit=True)
    admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    try:
        yield f"postgres://postgres@127.0.0.1:5432/{name}"
    finally:
        with contextlib.suppress(psycopg.Error):
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.close()


def _server_env(database: str, tmp_path) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("DEBUG", "LOG_LEVEL")}
    # The test settings keep this checkout's Celery queue, cache and channel prefixes its own.
    env.update(
        DJANGO_SETTINGS_MODULE="portal.settings_test",
        CELERY_WORKER_EAGER="0",
        DATABASE_URL=database,
        REDIS_URL="redis://127.0.0.1:6379/15",
        PORTAL_VAR_DIR=str(tmp_path / "var"),
        WEB_WORKERS="1",
        PYTHONUNBUFFERED="1",
    )
    env.pop("TEST_DATABASE", None)
    return env


def test_it_starts_server_mode_with_the_demo_again_with_its_bookings(fresh_database, tmp_path):
    _use_stop_and_start_again(_server_env(fresh_database, tmp_path), tmp_path, "--demo")


def test_it_never_reports_a_job_killed_by_stopping_server_mode_as_a_success(
    fresh_database, tmp_path
):
    env = _server_env(fresh_database, tmp_path)
    _stop_a_running_job_and_start_again(env, tmp_path, "--demo")
