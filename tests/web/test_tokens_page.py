"""The Tokens page (my API tokens: create, shown once, revoke) and the Audit page."""

import re

import pytest

from portal.models import ApiToken, AuditEvent, Membership
from portal.services.access.audit import audit_record
from tests.factories import ProjectFactory, UserFactory, member

pytestmark = pytest.mark.django_db


@pytest.fixture
def client_in(client, user, project):
    client.force_login(user)
    return client


def test_it_creates_a_token_and_shows_its_key_only_once(client_in, user):
    response = client_in.post(
        "/tokens/", {"name": "laptop", "scope": "read", "expires_days": "30"}, follow=True
    )
    html = response.content.decode()
    key = re.search(r'value="(gp_[^"]+)"', html).group(1)
    token = ApiToken.objects.get(user=user)
    assert (token.name, token.scope) == ("laptop", "read") and token.expires_at is not None
    assert "Read only" in html
    assert key not in client_in.get("/tokens/").content.decode()  # once
    assert AuditEvent.objects.get(action="token.create").via == "web"


def test_it_names_the_field_of_a_bad_token_form(client_in):
    response = client_in.post("/tokens/", {"name": "", "scope": "read", "expires_days": "0"})
    assert response.status_code == 400
    assert not ApiToken.objects.exists()


def test_it_revokes_my_token_but_not_someone_elses(client_in, user):
    client_in.post("/tokens/", {"name": "mine", "scope": "read-write"})
    mine = ApiToken.objects.get(user=user)
    bob = UserFactory(username="bob")
    client_in.force_login(bob)
    assert client_in.post(f"/tokens/{mine.pk}/revoke/").status_code == 404
    client_in.force_login(user)
    assert client_in.post(f"/tokens/{mine.pk}/revoke/").status_code == 302
    assert not ApiToken.objects.exists()


def test_it_shows_a_manager_their_projects_audit_and_refuses_a_member(client, user, project):
    audit_record(action="quota.change", project=project, before={"max_gpus": 1}, after={})
    audit_record(action="quota.change", project=ProjectFactory(slug="secret"))
    client.force_login(user)
    assert client.get("/audit/").status_code == 403
    assert "Audit log" not in client.get("/projects/vision/").content.decode()
    carol = UserFactory(username="carol")
    member(carol, project, Membership.Role.MANAGER)
    client.force_login(carol)
    assert "Audit log" in client.get("/projects/vision/").content.decode()
    html = client.get("/audit/").content.decode()
    assert "vision" in html and "secret" not in html
