"""`manage.py up` in server mode: demo logins only when asked (--demo), the database ensured."""

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest
from django.conf import settings as settings_module
from django.contrib.auth import get_user_model
from django.core.management import call_command

from portal.management.commands import up
from portal.web.asgi_process import free_port
from tests.process_tree import command, descendants, living

pytestmark = pytest.mark.django_db


@pytest.fixture
def no_servers(monkeypatch):
    """Stop `up` before it serves: record the child processes it would start instead."""
    started = []
    monkeypatch.setattr(up, "_start_agents", lambda url: started.append("agents") or [])
    monkeypatch.setattr(up, "_start_celery", lambda: started.append("celery") or [])
    monkeypatch.setattr(up, "serve", lambda **kwargs: started.append("web"))
    monkeypatch.setattr(up, "_when_listening", lambda host, port, then: then())
    monkeypatch.setattr(up, "_demo_queue", lambda: None)  # it waits for agents that never come
    # The signal handlers would outlive the command in this process (pytest's own Ctrl-C).
    monkeypatch.setattr(up, "_stop_on_signals", lambda children: None)
    monkeypatch.setattr(
        up, "_exit_now", lambda children: None
    )  # up leaves the process after serving
    return started


def test_it_creates_no_demo_admin_on_a_real_database_unless_asked(settings, no_servers):
    settings.EMBEDDED = False
    settings.REDIS_URL = settings.REDIS_URL or "redis://127.0.0.1:6379/15"
    call_command("up", "--port", "0")
    assert not get_user_model().objects.filter(username="admin").exists()
    assert "agents" not in no_servers

    call_command("up", "--port", "0", "--demo")
    assert get_user_model().objects.get(username="admin").is_superuser
    assert "agents" in no_servers


def _ensure_in_subprocess(database_url: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    env.update(DATABASE_URL=database_url, DJANGO_SETTINGS_MODULE="portal.settings", DEBUG="1")
    code = (
        "import django; django.setup(); "
        "from portal.management.commands.up import database_ensure; database_ensure()"
    )
    return subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60
    )


def test_it_creates_a_missing_postgresql_database(settings):
    import psycopg

    name = f"gpuportal_up_{settings.TEST_RUN_ID}"
    admin = psycopg.connect("postgresql://postgres@127.0.0.1:5432/postgres", autocommit=True)
    admin.execute(f'DROP DATABASE IF EXISTS "{name}"')
    try:
        done = _ensure_in_subprocess(f"postgres://postgres@127.0.0.1:5432/{name}")
        assert done.returncode == 0, done.stderr
        found = admin.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone()
        assert found is not None
    finally:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}"')
        admin.close()


def test_it_says_in_one_line_when_the_database_cannot_be_reached():
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    env.update(DATABASE_URL="postgres://postgres@127.0.0.1:1/gpuportal", DEBUG="1")
    done = subprocess.run(
        [sys.executable, "manage.py", "up", "--port", "0"],
        cwd=settings_module.BASE_DIR,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0
    assert "Traceback" not in done.stderr, done.stderr
    assert "Cannot reach the database (gpuportal on 127.0.0.1:1)" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr


@pytest.mark.parametrize(
    ("level", "access_log"), [("INFO", False), ("WARNING", False), ("DEBUG", True)]
)
def test_it_logs_requests_only_at_debug_level(settings, monkeypatch, level, access_log):
    import uvicorn

    from portal.management.commands import serve

    ran = {}
    monkeypatch.setattr(uvicorn, "run", lambda app, **kwargs: ran.update(kwargs))
    settings.LOGGING = {**settings.LOGGING, "root": {**settings.LOGGING["root"], "level": level}}
    serve.serve(host="127.0.0.1", port=0, workers=1)
    assert ran["access_log"] is access_log
    assert ran["log_level"] == ("debug" if access_log else "warning")


def test_it_starts_celery_without_banners_of_its_own(monkeypatch):
    started = []
    monkeypatch.setattr(
        up.subprocess, "Popen", lambda argv, **kwargs: started.append(argv) or SimpleNamespace()
    )
    up._start_celery()
    assert [argv[argv.index("--quiet") + 1] for argv in started] == ["worker", "worker", "beat"]
    # One worker for the allocation pass alone, one for everything else.
    assert [argv[argv.index("--queues") + 1] for argv in started[:2]] == [
        settings_module.CELERY_PASS_QUEUE,
        settings_module.CELERY_TASK_DEFAULT_QUEUE,
    ]


def server_env(database: str, var_dir, web_workers: int) -> dict:
    """`up`'s environment in server mode: PostgreSQL database `database`, Redis, no LOG_LEVEL.
    The test settings keep this checkout's Celery queue, cache and channel prefixes its own."""
    env = {k: v for k, v in os.environ.items() if k not in ("DEBUG", "LOG_LEVEL")}
    env.update(
        DJANGO_SETTINGS_MODULE="portal.settings_test",
        CELERY_WORKER_EAGER="0",
        DATABASE_URL=f"postgres://postgres@127.0.0.1:5432/{database}",
        REDIS_URL="redis://127.0.0.1:6379/15",
        PORTAL_VAR_DIR=str(var_dir),
        WEB_WORKERS=str(web_workers),
    )
    return env


@pytest.mark.parametrize("web_workers", [1, 2])
def test_it_stops_its_worker_beat_web_workers_and_agents_on_sigterm(
    settings, tmp_path, web_workers
):
    """Server mode: SIGTERM to `up` alone stops Celery's worker and beat, uvicorn's workers and
    the demo agents, and `up` exits with 0 (one web worker: uvicorn raises SIGTERM again once it
    stopped; several: its supervisor returns)."""
    import psycopg

    name = f"gpuportal_upstop_{settings.TEST_RUN_ID}"
    admin = psycopg.connect("postgresql://postgres@127.0.0.1:5432/postgres", autocommit=True)
    admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    env = server_env(name, tmp_path / "var", web_workers)
    port = free_port()
    log = open(tmp_path / "up.log", "w+")
    up_process = subprocess.Popen(
        [sys.executable, "manage.py", "up", "--demo", "--port", str(port)],
        cwd=settings_module.BASE_DIR,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # nothing else in this test's group: a leftover is up's fault
    )
    try:
        tree = _wait_for(lambda: _all_started(descendants(up_process.pid), web_workers), 180)
        assert tree, "up did not start everything in time"
        if web_workers == 1:  # a worker killed is started again (up supervises its children)
            (pass_worker,) = [p for p in up_children(up_process.pid) if "pass@" in command(p)]
            os.kill(pass_worker, signal.SIGKILL)
            # A new one: the killed one may still be listed until up has reaped it.
            again = _wait_for(
                lambda: [
                    p
                    for p in up_children(up_process.pid)
                    if "pass@" in command(p) and p != pass_worker
                ],
                30,
            )
            assert again and pass_worker not in again
            tree = _wait_for(lambda: _all_started(descendants(up_process.pid), web_workers), 60)
        up_process.send_signal(signal.SIGTERM)
        up_process.wait(timeout=30)
        assert up_process.returncode == 0
        _wait_for(lambda: not living(tree), 20)
        assert living(tree) == []
        log.seek(0)
        assert "Traceback" not in log.read()
    finally:
        # Its children too (they have sessions of their own): a worker left behind would take
        # the next tests' tasks from the queue, against a database dropped here.
        for pid in [*descendants(up_process.pid), up_process.pid]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(up_process.pid, signal.SIGKILL)
        log.seek(0)
        print(log.read()[-5000:])
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.close()


@pytest.mark.skipif(os.geteuid() != 0, reason="Celery warns only a worker run as root")
def test_it_says_in_one_line_that_its_workers_run_as_root(settings, tmp_path):
    """Celery's SecurityWarning is eight lines per worker (sixteen for up's two); up says it once."""
    import psycopg
    import redis

    name = f"gpuportal_upasadmin_{settings.TEST_RUN_ID}"
    admin = psycopg.connect("postgresql://postgres@127.0.0.1:5432/postgres", autocommit=True)
    admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    env = server_env(name, tmp_path / "var", web_workers=1)
    log = open(tmp_path / "up.log", "w+")
    up_process = subprocess.Popen(
        [sys.executable, "manage.py", "up", "--port", str(free_port())],
        cwd=settings_module.BASE_DIR,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    cache = redis.Redis.from_url("redis://127.0.0.1:6379/15")
    queues = (settings_module.CELERY_PASS_QUEUE, settings_module.CELERY_TASK_DEFAULT_QUEUE)
    try:
        # Each worker's heartbeat starts once it is ready, after Celery's privilege check.
        ready = _wait_for(
            lambda: all(cache.keys(f"*worker-heartbeat:{queue}") for queue in queues), 180
        )
        assert ready, "the workers did not start in time"
        up_process.send_signal(signal.SIGTERM)
        up_process.wait(timeout=30)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(up_process.pid, signal.SIGKILL)
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.close()
    log.seek(0)
    console = log.read()
    about_root = [
        line
        for line in console.splitlines()
        if re.search(r"superuser|\broot\b|--uid|User information: uid=", line)
    ]
    assert about_root == [
        "the Celery workers run as root, as up does: in production run up as another user, "
        "or the workers with celery worker --uid"
    ], console
    assert "SecurityWarning" not in console


def _all_started(tree: dict[int, str], web_workers: int) -> dict[int, str] | None:
    """The tree once Celery's worker and beat, the web workers and three agents run in it."""
    commands = [command(pid) for pid in tree]
    wanted = {"pass@": 1, "work@": 1, "beat": 1, "-m agents": 3}
    if web_workers > 1:  # processes of uvicorn's supervisor; one worker serves in up itself
        wanted["multiprocessing"] = web_workers
    counts = {w: sum(w in c for c in commands) for w in wanted}
    return tree if all(counts[w] >= n for w, n in wanted.items()) else None


def up_children(pid: int) -> list[int]:
    """The direct children of `up`, living."""
    tree = descendants(pid)
    return [child for child in tree if _parent(child) == pid]


def _parent(pid: int) -> int | None:
    try:
        stat = open(f"/proc/{pid}/stat").read().rpartition(")")[2].split()
    except OSError:
        return None
    return int(stat[1])


def _wait_for(predicate, timeout_s: float):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if found := predicate():
            return found
        time.sleep(0.5)
    return None
