"""OpenID Connect sign-in against a real provider (django-oidc-provider in its own process)."""

import pytest
from django.contrib.auth import get_user_model

from portal.models import GroupMappingRule, Membership
from tests.factories import ProjectFactory, UserFactory, member
from tests.sso.helpers import oidc_sign_in, use_sign_in_env

User = get_user_model()


@pytest.fixture
def oidc(settings, oidc_provider):
    use_sign_in_env(settings, oidc_provider.portal_env())
    return oidc_provider


@pytest.fixture
def rules(db):
    vision = ProjectFactory(slug="vision")
    nlp = ProjectFactory(slug="nlp")
    GroupMappingRule.objects.create(group="gpu-vision", project=vision)
    GroupMappingRule.objects.create(group="lab-*", project=nlp, role=Membership.Role.MANAGER)
    GroupMappingRule.objects.create(
        group="gpu-vision", project=nlp, source=GroupMappingRule.Source.LDAP
    )
    return {"vision": vision, "nlp": nlp}


def _roles(username: str) -> dict[str, tuple[str, bool]]:
    return {
        m.project.slug: (m.role, m.granted_by_rule)
        for m in Membership.objects.filter(user__username=username).select_related("project")
    }


def test_it_creates_the_user_on_first_sign_in_with_the_projects_its_groups_map_to(
    client, oidc, rules
):
    oidc.user("carol", "gpu-vision", "lab-nlp", "unmapped-group")

    response = oidc_sign_in(client, username="carol")

    assert response.status_code == 302 and response["Location"] == "/"
    carol = User.objects.get(username="carol")
    assert carol.email == "carol@idp.example.org" and carol.first_name == "Carol"
    assert not carol.has_usable_password()
    # The LDAP-only rule for gpu-vision does not apply to an OpenID sign-in.
    assert _roles("carol") == {"vision": ("member", True), "nlp": ("manager", True)}
    overview = client.get("/")
    assert overview.status_code == 200 and b'href="/projects/vision/"' in overview.content


def test_it_grants_nothing_for_groups_no_rule_maps(client, oidc, rules):
    oidc.user("erin", "unmapped-group")

    response = oidc_sign_in(client, username="erin")

    assert response.status_code == 302 and response["Location"] == "/"
    assert _roles("erin") == {}


def test_it_removes_rule_memberships_when_the_group_goes_and_keeps_manual_ones(client, oidc, rules):
    dave = UserFactory(username="dave")
    manual = ProjectFactory(slug="manual")
    member(dave, manual)
    member(dave, rules["nlp"])  # by hand, though lab-* would grant manager
    oidc.user("dave", "gpu-vision", "lab-x")
    oidc_sign_in(client, username="dave")
    assert _roles("dave") == {
        "vision": ("member", True),
        "manual": ("member", False),
        "nlp": ("member", False),
    }

    oidc.user("dave")  # removed from every group at the provider
    client.logout()
    oidc_sign_in(client, username="dave")

    assert _roles("dave") == {"manual": ("member", False), "nlp": ("member", False)}


def test_it_follows_next_after_signing_in(client, oidc, rules):
    oidc.user("frank", "gpu-vision")

    response = oidc_sign_in(client, username="frank", next_url="/bookings/")

    assert response["Location"] == "/bookings/"


def test_it_does_not_create_users_when_oidc_create_user_is_off(client, settings, oidc, rules):
    use_sign_in_env(settings, oidc.portal_env(OIDC_CREATE_USER="false"))
    oidc.user("gina", "gpu-vision")

    response = oidc_sign_in(client, username="gina")

    assert response["Location"] == "/accounts/login/?sso=failed"
    assert not User.objects.filter(username="gina").exists()
    page = client.get(response["Location"])
    assert b"Signing in with Test IdP did not succeed" in page.content


def test_it_sends_the_user_back_to_sign_in_when_the_provider_cannot_be_reached(
    client, settings, oidc, rules
):
    from portal.web.asgi_process import free_port

    closed = f"http://127.0.0.1:{free_port()}/token"
    use_sign_in_env(settings, oidc.portal_env(OIDC_OP_TOKEN_ENDPOINT=closed))
    oidc.user("hank", "gpu-vision")

    response = oidc_sign_in(client, username="hank")

    assert response.status_code == 302
    assert response["Location"] == "/accounts/login/?sso=failed"
    assert "_auth_user_id" not in client.session


def test_it_shows_the_provider_button_beside_the_password_form(client, oidc):
    page = client.get("/accounts/login/?next=/book/")

    assert b"Sign in with Test IdP" in page.content
    assert b'href="/oidc/authenticate/?next=/book/"' in page.content
    assert b'name="password"' in page.content


def test_it_answers_404_for_the_oidc_pages_when_oidc_is_not_set_up(client, db):
    assert client.get("/oidc/authenticate/").status_code == 404
    assert client.get("/oidc/callback/?code=x&state=y").status_code == 404
    assert b"Sign in with" not in client.get("/accounts/login/").content


def test_it_hides_the_password_form_and_refuses_passwords_when_local_login_is_off(
    client, settings, oidc, db
):
    UserFactory(username="local")  # password pw-secret-123
    form = {"username": "local", "password": "pw-secret-123"}
    assert client.post("/accounts/login/", form)["Location"] == "/"
    client.logout()

    use_sign_in_env(settings, oidc.portal_env(LOCAL_LOGIN_ENABLED="false"))
    page = client.get("/accounts/login/")
    refused = client.post("/accounts/login/", form)

    assert b"Sign in with Test IdP" in page.content and b'name="password"' not in page.content
    assert refused.status_code == 200 and "_auth_user_id" not in client.session


def test_it_sends_the_admin_login_to_the_provider_page_when_passwords_are_off(
    client, settings, oidc, db
):
    assert client.get("/admin/login/?next=/admin/").status_code == 200

    use_sign_in_env(settings, oidc.portal_env(LOCAL_LOGIN_ENABLED="false"))
    response = client.get("/admin/login/?next=/admin/portal/")

    assert response.status_code == 302
    assert response["Location"] == "/accounts/login/?next=/admin/portal/"
