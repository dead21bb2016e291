"""`manage.py up` in server mode seeds the published demo logins only when asked (--demo)."""

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command

from portal.management.commands import up

pytestmark = pytest.mark.django_db


@pytest.fixture
def no_servers(monkeypatch):
    """Stop `up` before it serves: record the child processes it would start instead."""
    started = []
    monkeypatch.setattr(up, "_start_agents", lambda url: started.append("agents") or [])
    monkeypatch.setattr(up, "_start_celery", lambda: started.append("celery") or [])
    monkeypatch.setattr("daphne.cli.CommandLineInterface.run", lambda self, argv: None)
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
