"""Faults against real processes: nothing double-booked, nothing lost, 503 (never 500) meanwhile.

A Celery worker process killed with SIGKILL mid-pass, PostgreSQL dropping the portal's
connections, Redis stopped and restarted (a private redis-server on a spare port, never the
shared one).
"""

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time

import psycopg
import pytest
from django.db import close_old_connections, connection
from rest_framework.test import APIClient

from portal.models import Allocation, Booking, Membership
from tests.factories import ProjectFactory, QuotaFactory, UserFactory, make_node, member
from tests.workers import celery_worker
from tests.workers import wait_until as _wait

pytestmark = pytest.mark.django_db(transaction=True)


def _booker():
    user = UserFactory(username="faulty")
    project = ProjectFactory(slug="faults")
    QuotaFactory(project=project)
    member(user, project, Membership.Role.MEMBER)
    client = APIClient()
    client.force_authenticate(user)
    return client


def _admin_connection() -> psycopg.Connection:
    db = connection.settings_dict
    return psycopg.connect(host=db["HOST"], port=db["PORT"], user=db["USER"], dbname=db["NAME"])


@pytest.fixture
def worker(settings):
    """A prefork Celery worker with one child process, on this checkout's test queue."""
    # The pass waits for the test's lock, not fails.
    with celery_worker(settings, BOOKING_LOCK_TIMEOUT_MS="60000") as process:
        yield process


def test_it_runs_a_pass_again_when_the_worker_process_running_it_is_killed(worker):
    client = _booker()
    nodes = [make_node("fault-node", gpus=2).pk]
    hold = _admin_connection()
    hold.execute("SELECT id FROM portal_node WHERE id = ANY(%s) FOR UPDATE", [nodes])
    admin = psycopg.connect(hold.info.dsn, autocommit=True)  # sees pg_stat_activity live
    try:
        booking = client.post("/api/v1/bookings/", {"gpus": 2, "duration_s": 600}, format="json")
        assert booking.status_code == 201, booking.content
        waiting = _wait(  # the pass has begun and waits for the node lock the test holds
            lambda: admin.execute(
                "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
                "AND wait_event_type = 'Lock' AND query LIKE %s",
                ["%portal_node%FOR UPDATE%"],
            ).fetchone(),
            60,
            "the pass to wait for the node lock",
        )[0]
        (child,) = subprocess.run(
            ["pgrep", "-P", str(worker.pid)], capture_output=True, text=True, check=True
        ).stdout.split()
        os.kill(int(child), signal.SIGSTOP)  # freeze the pass mid-transaction,
        # end its session as PostgreSQL does at once for a dead client that is not waiting,
        admin.execute("SELECT pg_terminate_backend(%s)", [waiting])
        _wait(
            lambda: (
                not admin.execute(
                    "SELECT 1 FROM pg_stat_activity WHERE pid = %s", [waiting]
                ).fetchone()
            ),
            30,
            "the killed pass's session to end",
        )
        os.kill(int(child), signal.SIGKILL)  # and kill the process that was running it
        time.sleep(2)  # the worker sees its child die and puts the pass back on the queue
    finally:
        hold.rollback()
        hold.close()
        admin.close()
    done = _wait(
        lambda: Booking.objects.filter(pk=booking.json()["id"], state="active").first(),
        60,
        "the redelivered pass to start the booking",
    )
    assert Allocation.objects.filter(booking=done, live=True).count() == 2
    assert Allocation.objects.filter(live=True).count() == 2


def test_it_answers_through_postgresql_dropping_its_connections(api, project, cluster):
    assert api.get("/api/v1/bookings/").status_code == 200
    with _admin_connection() as admin:
        admin.autocommit = True  # sees pg_stat_activity live
        killed = [
            pid
            for (pid,) in admin.execute(
                "SELECT pid FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid()"
            ).fetchall()
        ]
        admin.execute("SELECT pg_terminate_backend(pid) FROM unnest(%s::int[]) AS pid", [killed])
        # pg_terminate_backend only signals: wait until the sessions are really gone.
        _wait(
            lambda: (
                not admin.execute(
                    "SELECT 1 FROM pg_stat_activity WHERE pid = ANY(%s)", [killed]
                ).fetchone()
            ),
            30,
            "the terminated sessions to end",
        )
    # The pool checks a connection before handing it out and replaces a dead one, backing off
    # about a second between tries: with several dead at once a request may wait out the pool's
    # timeout, and that answer is a 503 with Retry-After, never a 500; then service is back.
    answers = []
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and [s for s, _ in answers[-3:]] != [200, 200, 200]:
        close_old_connections()  # what the request_started signal does (the test client skips it)
        response = api.get("/api/v1/bookings/")
        answers.append((response.status_code, response.get("Retry-After")))
    assert all(status == 200 or (status == 503 and retry) for status, retry in answers), answers
    assert [s for s, _ in answers[-3:]] == [200, 200, 200], answers


@pytest.fixture
def private_redis():
    """A redis-server of the test's own on a spare port; stop() and start() it at will."""
    if not shutil.which("redis-server"):
        pytest.skip("redis-server is not installed")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    workdir = tempfile.mkdtemp(prefix="fault-redis-")

    class Server:
        url = f"redis://127.0.0.1:{port}/0"
        process = None

        def start(self):
            self.process = subprocess.Popen(
                [
                    "redis-server",
                    "--port",
                    str(port),
                    "--bind",
                    "127.0.0.1",
                    "--save",
                    "",
                    "--appendonly",
                    "no",
                    "--dir",
                    workdir,
                ],
                stdout=subprocess.DEVNULL,
            )
            _wait(lambda: _answers(port), 10, "redis-server to listen")

        def stop(self):
            self.process.terminate()
            self.process.wait(timeout=10)

    server = Server()
    server.start()
    yield server
    if server.process.poll() is None:
        server.stop()
    shutil.rmtree(workdir, ignore_errors=True)


def _answers(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


OUTAGE_S = 20


def test_it_answers_503_while_redis_is_stopped_and_recovers_when_it_is_back(
    private_redis, api, user, project, cluster, settings
):
    cache = dict(settings.CACHES["default"])
    settings.CACHES = {"default": {**cache, "LOCATION": private_redis.url}}
    body = {"gpus": 1, "duration_s": 600}
    assert api.get("/").status_code in (200, 302)
    assert api.post("/api/v1/bookings/estimate/", body, format="json").status_code == 200
    private_redis.stop()
    estimates, submits = set(), set()
    deadline = time.monotonic() + OUTAGE_S
    while time.monotonic() < deadline:
        # The estimate's rate limit lives in Redis: busy. A submission's Idempotency-Key lives
        # with the booking in PostgreSQL: it is made once and replayed, Redis or not.
        estimate = api.post("/api/v1/bookings/estimate/", body, format="json")
        estimates.add(estimate.status_code)
        if estimate.status_code == 503:
            assert estimate["Retry-After"]
        submit = api.post("/api/v1/bookings/", body, format="json", HTTP_IDEMPOTENCY_KEY="fault-1")
        submits.add(submit.status_code)
        time.sleep(1)
    assert estimates == {503} and submits == {201, 200}
    assert Booking.objects.count() == 1
    private_redis.start()
    assert api.post("/api/v1/bookings/estimate/", body, format="json").status_code == 200
    replayed = api.post("/api/v1/bookings/", body, format="json", HTTP_IDEMPOTENCY_KEY="fault-1")
    assert replayed.status_code == 200 and Booking.objects.count() == 1
