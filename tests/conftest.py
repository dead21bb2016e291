"""Shared fixtures. The suite runs on PostgreSQL and Redis (portal.settings_test); the tests marked
both_databases run once more on SQLite (TEST_DATABASE=sqlite, tests/portal/test_both_databases.py)."""

import os

import pytest
from rest_framework.test import APIClient

from portal.services.allocation.estimate import estimate_snapshot_forget
from portal.web.overview import summary_forget
from tests.factories import ProjectFactory, QuotaFactory, UserFactory, make_node, member

# The servers the suite starts (daphne, `manage.py up`, `serve`) inherit this environment. In
# production a request that waited WEB_QUEUE_WAIT_S (0.25 s) for a thread gets 503 at once; on a
# loaded CI machine a fresh server's first request can wait that long, and a browser test then
# waits 30 s for a login form the 503 page does not have (test_it_renders_the_staff_pages
# failed so beside a benchmark). The tests of that shedding set their own value
# (tests/portal/test_serving.py).
os.environ.setdefault("WEB_QUEUE_WAIT_S", "30")


@pytest.fixture(autouse=True)
def _clean_cache(settings):
    """Start every test with none of this checkout's cache keys in Redis (others' are left alone)."""
    import redis

    client = redis.Redis.from_url(settings.REDIS_URL)
    keys = list(client.scan_iter(f"{settings.TEST_RUN_ID}:*", count=1000))
    if keys:
        client.delete(*keys)
    client.close()
    estimate_snapshot_forget()  # the estimates' in-process copy of the queue, likewise
    summary_forget()  # and the overview's summary
    yield


@pytest.fixture(autouse=True)
def _environment_kept():
    """Leave os.environ as the test found it: `up` run in-process (tests/portal/
    test_up_server_mode.py) sets the demo's defaults there for the processes it starts, and a
    later subprocess (the SQLite run of tests/portal/test_both_databases.py) would inherit them
    (QUOTA_BORROWING on turned its quota scenarios into borrowed starts)."""
    kept = dict(os.environ)
    yield
    if os.environ != kept:
        os.environ.clear()
        os.environ.update(kept)


@pytest.fixture
def user(db):
    return UserFactory(username="alice")


@pytest.fixture
def project(db, user):
    project = ProjectFactory(slug="vision")
    member(user, project)
    QuotaFactory(project=project, max_gpus=16)
    return project


@pytest.fixture
def cluster(db):
    """Two up nodes of 8 A100-80GB each."""
    return [make_node("node-a"), make_node("node-b")]


@pytest.fixture
def admin_client(client):
    """A browser session of the superuser "root" (replaces pytest-django's own admin_client)."""
    admin = UserFactory(username="root", is_staff=True, is_superuser=True)
    client.force_login(admin)
    return client


@pytest.fixture
def api(user):
    client = APIClient()
    client.force_authenticate(user)
    return client


def error_of(response) -> dict:
    """The error object of an API error response (asserting it has the one shape)."""
    body = response.json()
    assert set(body) == {"error"}, body
    assert {"code", "message", "fields"} <= set(body["error"]), body
    return body["error"]


# The sign-in tests' OpenID provider and LDAP server (session-wide subprocesses).
from tests.sso_servers import ldap_server, oidc_provider  # noqa: E402,F401
