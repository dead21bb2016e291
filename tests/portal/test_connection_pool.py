"""PostgreSQL connections are pooled and bounded; a request that cannot get one in time is a 503."""

import time
from contextlib import contextmanager

import pytest
from django.db import connection
from django.test import Client
from psycopg_pool import PoolTimeout
from rest_framework.test import APIClient

from portal.models import ApiToken
from portal.models.tokens import hash_token
from tests.conftest import error_of


@contextmanager
def pool_exhausted():
    """Every connection of this process's pool checked out, and a short wait for one."""
    pool = connection.pool
    assert pool is not None, "server mode must pool its PostgreSQL connections"
    connection.close()  # the test's own connection goes back to the pool first
    # Every connection still free: a thread of an earlier test (a live server, a background
    # rebuild) may keep one checked out for the rest of the session.
    held = []
    while len(held) < pool.max_size:
        try:
            held.append(pool.getconn(timeout=0.5))
        except PoolTimeout:
            break
    assert held, "the pool has no connection left at all"
    timeout, pool.timeout = pool.timeout, 0.2
    try:
        yield
    finally:
        pool.timeout = timeout
        for conn in held:
            pool.putconn(conn)


def test_it_bounds_connections_with_a_pool_and_no_persistent_connections(settings):
    database = settings.DATABASES["default"]
    assert database["CONN_MAX_AGE"] == 0
    assert database["OPTIONS"]["pool"] == {
        "min_size": settings.DB_POOL_MIN_SIZE,
        "max_size": settings.DB_POOL_MAX_SIZE,
        "timeout": settings.DB_POOL_TIMEOUT_S,
    }


@pytest.mark.django_db(transaction=True)
def test_it_answers_503_to_token_authentication_when_no_connection_is_free_and_recovers(user):
    ApiToken.objects.create(user=user, key_hash=hash_token("gp_pool"), prefix="gp_pool")
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION="Token gp_pool")
    with pool_exhausted():
        started = time.monotonic()
        response = api.get("/api/v1/bookings/")
        waited = time.monotonic() - started
    assert response.status_code == 503
    assert response["Retry-After"]
    assert error_of(response)["code"] == "busy"
    assert waited < 2
    assert api.get("/api/v1/bookings/").status_code == 200


@pytest.mark.django_db(transaction=True)
def test_it_answers_a_busy_page_when_no_connection_is_free_and_recovers(user, project, cluster):
    client = Client()
    client.force_login(user)
    with pool_exhausted():
        response = client.get("/")
    assert response.status_code == 503
    assert response["Retry-After"]
    assert b"retry in a few seconds" in response.content.lower()
    assert client.get("/").status_code == 200
