"""LDAP sign-in through the login form, against a real slapd with a small directory."""

import pytest
from django.contrib.auth import get_user_model

from portal.models import GroupMappingRule, Membership
from tests.factories import ProjectFactory, UserFactory, member
from tests.sso.helpers import use_sign_in_env
from tests.sso_servers import LDAP_PASSWORD

User = get_user_model()


@pytest.fixture
def ldap(settings, ldap_server, db):
    use_sign_in_env(settings, ldap_server.portal_env())
    vision = ProjectFactory(slug="vision")
    nlp = ProjectFactory(slug="nlp")
    GroupMappingRule.objects.create(group="gpu-vision", project=vision, role="manager")
    GroupMappingRule.objects.create(group="lab-*", project=nlp, source="ldap")
    GroupMappingRule.objects.create(group="unmapped", project=vision, source="oidc")
    return {"vision": vision, "nlp": nlp}


def _roles(username: str) -> dict[str, tuple[str, bool]]:
    return {
        m.project.slug: (m.role, m.granted_by_rule)
        for m in Membership.objects.filter(user__username=username).select_related("project")
    }


def _sign_in(client, username: str, password: str = LDAP_PASSWORD):
    return client.post("/accounts/login/", {"username": username, "password": password})


def test_it_creates_the_user_from_the_directory_with_the_projects_its_groups_map_to(client, ldap):
    response = _sign_in(client, "lena")

    assert response.status_code == 302 and response["Location"] == "/"
    lena = User.objects.get(username="lena")
    assert (lena.email, lena.first_name, lena.last_name) == (
        "lena@directory.example.org",
        "Lena",
        "Berg",
    )
    assert _roles("lena") == {"vision": ("manager", True), "nlp": ("member", True)}
    assert b'href="/projects/vision/"' in client.get("/").content


def test_it_applies_only_rules_for_ldap_or_any_source(client, ldap):
    _sign_in(client, "omar")

    # omar's "unmapped" group maps to vision only for OpenID sign-ins.
    assert _roles("omar") == {"nlp": ("member", True)}


def test_it_refuses_a_wrong_password_and_creates_nobody(client, ldap):
    response = _sign_in(client, "lena", "not-her-password")

    assert response.status_code == 200 and b"Please enter a correct username" in response.content
    assert not User.objects.filter(username="lena").exists()
    assert "_auth_user_id" not in client.session


def test_it_removes_rule_memberships_when_the_rule_goes_and_keeps_manual_ones(client, ldap):
    omar = UserFactory(username="omar")
    manual = ProjectFactory(slug="manual")
    member(omar, manual, role="manager")
    _sign_in(client, "omar")
    assert set(_roles("omar")) == {"nlp", "manual"}

    GroupMappingRule.objects.filter(group="lab-*").delete()
    client.logout()
    _sign_in(client, "omar")

    assert _roles("omar") == {"manual": ("manager", False)}


def test_it_signs_directory_users_in_with_local_login_off(client, settings, ldap_server, ldap):
    use_sign_in_env(settings, ldap_server.portal_env(LOCAL_LOGIN_ENABLED="false"))
    UserFactory(username="local")

    assert _sign_in(client, "lena")["Location"] == "/"
    client.logout()
    assert _sign_in(client, "local", "pw-secret-123").status_code == 200
    # The API's password-for-token exchange goes through the same backends.
    token = "/api/v1/auth/token/"
    ok = client.post(token, {"username": "lena", "password": LDAP_PASSWORD}, "application/json")
    refused = client.post(
        token, {"username": "local", "password": "pw-secret-123"}, "application/json"
    )
    assert ok.status_code in (200, 201) and "token" in ok.json()
    assert refused.status_code in (400, 401, 403)


def test_it_matches_the_username_literally_in_the_search_filter(client, ldap):
    # Unescaped, "len*" would find lena's entry and bind with her password.
    response = _sign_in(client, "len*")

    assert response.status_code == 200
    assert not User.objects.filter(username__startswith="len").exists()
