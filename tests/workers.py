"""A real Celery worker for the tests that need one (a killed child, a redelivered task)."""

import os
import subprocess
import sys
import time
from contextlib import contextmanager

from django.db import connection


@contextmanager
def celery_worker(settings, **extra_env):
    """A prefork worker with one child process on this checkout's test queue and test database;
    the test's own .delay() calls go to it while it runs."""
    from portal.celery import app

    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "portal.settings_test",
        "DATABASE_URL": f"postgres://postgres@127.0.0.1:5432/{connection.settings_dict['NAME']}",
        "CELERY_WORKER_EAGER": "0",
        **extra_env,
    }
    queues = f"{settings.CELERY_TASK_DEFAULT_QUEUE},{settings.CELERY_PASS_QUEUE}"
    argv = ["-m", "celery", "-A", "portal", "worker", "--pool", "prefork", "--concurrency", "1"]
    process = subprocess.Popen(
        [sys.executable, *argv, "--loglevel", "WARNING", "--queues", queues],
        cwd=settings.BASE_DIR,
        env=env,
    )
    app.conf.task_always_eager = False
    try:
        yield process
    finally:
        app.conf.task_always_eager = True
        process.terminate()
        # Warm shutdown waits for the task in hand; on a loaded machine (CI beside other work)
        # that took over 30 s. A worker that never stops still fails the test.
        process.wait(timeout=90)


def wait_until(predicate, timeout_s: float, what: str):
    """The predicate's first true value, polled every 0.1 s; fails after timeout_s."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = predicate()
        if found:
            return found
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")
