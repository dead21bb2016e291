"""/readyz in server mode fails within one pass interval once no worker consumes the pass
queue (a worker killed with SIGKILL), not only when the last pass has grown old."""

import os
import signal

import pytest
from django.test import Client
from django.utils import timezone

from portal.services.allocation.allocation import allocation_pass
from tests.workers import celery_worker, wait_until


def _worker_check() -> dict:
    return Client().get("/readyz").json()["checks"]["worker"]


@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(180)
def test_it_is_not_ready_within_a_pass_interval_after_the_worker_is_killed(settings):
    assert settings.REDIS_URL, "server mode: the heartbeat lives in Redis"
    settings.READY_WORKER_MAX_AGE_S = 3.0
    allocation_pass(now=timezone.now())  # a fresh pass: only the worker check can fail
    assert not _worker_check()["ok"]  # no worker yet
    with celery_worker(settings) as worker:
        wait_until(lambda: _worker_check()["ok"], 90, "the worker's heartbeat")
        assert Client().get("/readyz").status_code == 200
        os.kill(worker.pid, signal.SIGKILL)
        worker.wait(timeout=10)
        killed = timezone.now()
        wait_until(lambda: not _worker_check()["ok"], 10, "/readyz to see no worker")
        assert (timezone.now() - killed).total_seconds() <= 3.0 + 1.5
        response = Client().get("/readyz")
        assert response.status_code == 503 and response["Retry-After"] == "5"
        assert response.json()["checks"]["allocation_pass"]["ok"]
