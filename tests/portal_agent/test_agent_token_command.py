"""`manage.py agent_token HOSTNAME`: its token authenticates the node; --revoke stops it."""

import importlib
from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from agents import protocol
from portal.models import Node
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


@pytest.mark.parametrize(
    "name", ["evil slots=99", "gpu_01", "gpu-", "a" * 64, "gpu\n01", "gpu..01"]
)
def test_it_refuses_a_node_name_that_is_no_host_name(name):
    with pytest.raises(CommandError, match="must be a host name") as refused:
        _issue(name)
    assert len(str(refused.value).splitlines()) == 1
    assert not Node.objects.exists()


def test_it_issues_a_token_for_a_fully_qualified_host_name():
    assert _issue("gpu-01.cluster.example").startswith("gpa")
    assert Node.objects.get().hostname == "gpu-01.cluster.example"


def test_it_blanks_a_stored_address_that_is_no_address_when_migrating():
    from django.apps import apps

    migration = importlib.import_module("portal.migrations.0028_node_name_and_address_forms")
    _issue("gpu-a")
    _issue("gpu-b")
    Node.objects.filter(hostname="gpu-a").update(address="10.9.9.9 --nproc-per-node=999")
    Node.objects.filter(hostname="gpu-b").update(address="10.0.0.2")
    migration.blank_bad_addresses(apps, None)
    assert dict(Node.objects.values_list("hostname", "address")) == {
        "gpu-a": "",
        "gpu-b": "10.0.0.2",
    }
