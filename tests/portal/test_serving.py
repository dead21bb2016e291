"""The served portal (uvicorn workers, as `up` runs it) refuses what it cannot serve with 503."""

import os
import threading
import time
import urllib.error
import urllib.request

import pytest
from django.conf import settings
from django.db import connection

from portal.management.commands.serve import web_workers
from portal.models import ApiToken
from portal.models.tokens import hash_token
from portal.web.asgi_process import free_port, serve_start, server_stop


def _env(**extra) -> dict:
    db = connection.settings_dict
    return os.environ | {
        "DJANGO_SETTINGS_MODULE": "portal.settings_test",
        "DATABASE_URL": f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}",
        "REDIS_URL": settings.REDIS_URL,
        "DEBUG": "0",
        "SECRET_KEY": "serving-test-" + "k" * 40,
        **extra,
    }


def _get(url: str, token: str) -> tuple[int, object, bytes, float]:
    started = time.monotonic()
    request = urllib.request.Request(url, headers={"Authorization": f"Token {token}"})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            status, headers, body = response.status, response.headers, response.read()
    except urllib.error.HTTPError as error:
        status, headers, body = error.code, error.headers, error.read()
    return status, headers, body, time.monotonic() - started


@pytest.mark.django_db(transaction=True)
def test_it_refuses_a_burst_beyond_capacity_fast_with_503_and_never_500(user):
    ApiToken.objects.create(user=user, key_hash=hash_token("gp_burst"), prefix="gp_burst")
    port = free_port()
    env = _env(WEB_MAX_INFLIGHT="3", WEB_QUEUE_WAIT_S="0.3", WEB_RETRY_AFTER_S="2")
    server = serve_start(port=port, env=env, workers=1)
    answers: list = []
    try:
        url = f"http://127.0.0.1:{port}/api/v1/bookings/"
        assert _get(url, "gp_burst")[0] == 200
        threads = [
            threading.Thread(target=lambda: answers.append(_get(url, "gp_burst")))
            for _ in range(40)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        after = _get(url, "gp_burst")
    finally:
        server_stop(server)
    statuses = sorted({status for status, *_ in answers})
    assert set(statuses) <= {200, 503}, statuses
    refused = [
        (headers, body, waited) for status, headers, body, waited in answers if status == 503
    ]
    assert refused, "a burst of 40 at 3 admitted should have been refused in part"
    assert all(h["Retry-After"] == "2" and b'"code": "busy"' in b for h, b, _ in refused)
    assert sorted(waited for *_, waited in refused)[len(refused) // 2] < 1.0  # refused fast
    assert [status for status, *_ in answers].count(200) >= 3
    assert after[0] == 200


def test_it_serves_on_several_workers_in_server_mode_and_one_embedded(settings):
    settings.REDIS_URL, settings.WEB_WORKERS = "redis://127.0.0.1:6379/15", 5
    assert web_workers() == 5
    settings.REDIS_URL = ""
    assert web_workers() == 1


@pytest.mark.parametrize(
    "name, value, said",
    [
        ("DB_POOL_MAX_SIZE", "0", "DB_POOL_MAX_SIZE"),
        ("DB_POOL_TIMEOUT_S", "0", "DB_POOL_TIMEOUT_S"),
        ("WEB_WORKERS", "0", "WEB_WORKERS"),
        ("WEB_QUEUE_WAIT_S", "-1", "WEB_QUEUE_WAIT_S"),
        ("TOKEN_CACHE_S", "-5", "TOKEN_CACHE_S"),
        ("ESTIMATE_RATE", "lots", "ESTIMATE_RATE"),
        ("ESTIMATE_RATE", "0/min", "ESTIMATE_RATE"),
        ("ESTIMATE_SNAPSHOT_TTL_S", "-1", "ESTIMATE_SNAPSHOT_TTL_S"),
        ("ESTIMATE_SNAPSHOT_TTL_S", "301", "ESTIMATE_SNAPSHOT_TTL_S"),
    ],
)
def test_it_refuses_serving_settings_out_of_range(name, value, said):
    import subprocess
    import sys

    env = os.environ | {"DJANGO_SETTINGS_MODULE": "portal.settings_test", name: value}
    code = "import django; django.setup()"
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert done.returncode != 0
    assert said in done.stderr.strip().splitlines()[-1]


def test_it_takes_an_empty_setting_as_its_default(monkeypatch):
    from portal.env import envfloat, envint

    monkeypatch.setenv("WEB_WORKERS", "")
    assert envint("WEB_WORKERS", 3) == 3
    assert envfloat("WEB_WORKERS", 0.5) == 0.5
