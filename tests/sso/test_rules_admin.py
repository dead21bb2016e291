"""Admins edit the group mapping rules in the admin panel."""

from portal.models import GroupMappingRule
from portal.services.access.sso import memberships_sync
from tests.factories import ProjectFactory, UserFactory


def test_it_lets_an_admin_add_a_rule_that_the_next_sign_in_applies(client, db):
    client.force_login(UserFactory(username="root", is_staff=True, is_superuser=True))
    vision = ProjectFactory(slug="vision")

    response = client.post(
        "/admin/portal/groupmappingrule/add/",
        {"source": "any", "group": "gpu-*", "project": vision.pk, "role": "manager"},
    )

    assert response.status_code == 302, response.content.decode()[:2000]
    listing = client.get("/admin/portal/groupmappingrule/").content.decode()
    assert "gpu-*" in listing and "vision" in listing
    user = UserFactory()
    memberships_sync(user=user, groups=["gpu-lab"], source="ldap")
    assert user.memberships.get().role == "manager"


def test_it_refuses_the_same_rule_twice(client, db):
    client.force_login(UserFactory(username="root", is_staff=True, is_superuser=True))
    vision = ProjectFactory(slug="vision")
    GroupMappingRule.objects.create(group="gpu-*", project=vision)

    response = client.post(
        "/admin/portal/groupmappingrule/add/",
        {"source": "any", "group": "gpu-*", "project": vision.pk, "role": "member"},
    )

    assert response.status_code == 200 and GroupMappingRule.objects.count() == 1
    assert "already exists" in response.content.decode()


def test_it_shows_which_memberships_a_rule_made_on_the_project_page(client, db):
    client.force_login(UserFactory(username="root", is_staff=True, is_superuser=True))
    vision = ProjectFactory(slug="vision")
    GroupMappingRule.objects.create(group="gpu-vision", project=vision)
    memberships_sync(user=UserFactory(username="ruled"), groups=["gpu-vision"], source="oidc")

    page = client.get(f"/admin/portal/project/{vision.pk}/change/").content.decode()

    assert "Granted by rule" in page and "icon-yes.svg" in page
