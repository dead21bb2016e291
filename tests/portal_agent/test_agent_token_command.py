"""`manage.py agent_token HOSTNAME`: its token authenticates the node; --revoke stops it."""

from io import StringIO

import pytest
from django.core.management import call_command

from agents import protocol
from tests.portal_agent.conftest import AgentClient

pytestmark = pytest.mark.django_db


def _issue(hostname: str) -> str:
    out = StringIO()
    call_command("agent_token", hostname, stdout=out)
    return out.getvalue().strip()


def test_it_prints_a_token_that_authenticates_the_node_until_revoked():
    token = _issue("gpu-cmd")
    agent = AgentClient(token)
    assert agent.get(protocol.DESIRED_PATH).status_code == 200

    out = StringIO()
    call_command("agent_token", "gpu-cmd", "--revoke", stdout=out)
    assert "revoked" in out.getvalue()
    assert agent.get(protocol.DESIRED_PATH).status_code == 401


def test_it_replaces_the_old_token_when_issuing_a_new_one():
    old = _issue("gpu-cmd")
    new = _issue("gpu-cmd")
    assert AgentClient(old).get(protocol.DESIRED_PATH).status_code == 401
    assert AgentClient(new).get(protocol.DESIRED_PATH).status_code == 200
