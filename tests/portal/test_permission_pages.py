"""The project page, accounting (page and API) and the notification preferences ask the roles
table (permissions.CAN): a member, a manager, staff and the superuser get what it says."""

from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone
from rest_framework.test import APIClient

from portal.models import Allocation, Membership
from portal.services.access import permissions
from portal.services.notify.selectors import preferences_get
from tests.factories import BookingFactory, ProjectFactory, UserFactory, make_node, member

pytestmark = pytest.mark.django_db

ROLES = permissions.ROLES


@pytest.fixture
def site():
    """vision (alice a member, carol its manager) and nlp (neither's), each with an hour held."""
    vision, nlp = ProjectFactory(slug="vision"), ProjectFactory(slug="nlp")
    people = {
        "member": UserFactory(username="alice"),
        "manager": UserFactory(username="carol"),
        "staff": UserFactory(username="sam", is_staff=True),
        "superuser": UserFactory(username="root", is_staff=True, is_superuser=True),
    }
    member(people["member"], vision)
    member(people["manager"], vision, Membership.Role.MANAGER)
    node = make_node("node-a", gpus=2)
    end = timezone.now() - timedelta(hours=1)
    for project, gpu in ((vision, node.gpus.all()[0]), (nlp, node.gpus.all()[1])):
        booking = BookingFactory(project=project, state="finished")
        Allocation.objects.create(
            booking=booking, gpu=gpu, start=end - timedelta(hours=1), end=end, fraction=1.0
        )
    return people


def _sees(role: str, action: str, *, joined: bool) -> bool:
    reach = permissions.CAN[action][1][role]
    return reach == "all" or (reach == "joined" and joined)


@pytest.mark.parametrize("role", ROLES)
def test_it_opens_a_project_page_as_the_table_says(site, role):
    client = Client()
    client.force_login(site[role])

    for slug, joined in (("vision", True), ("nlp", False)):
        expected = 200 if _sees(role, "project.view", joined=joined) else 404
        assert client.get(f"/projects/{slug}/").status_code == expected, slug
    assert [_sees(role, "project.view", joined=j) for j in (True, False)] == {
        "member": [True, False],
        "manager": [True, False],
        "staff": [True, True],
        "superuser": [True, True],
    }[role]


@pytest.mark.parametrize("role", ROLES)
def test_it_reports_accounting_for_the_projects_the_table_lets_see(site, role):
    api = APIClient()
    api.force_authenticate(site[role])
    since = (timezone.now() - timedelta(days=1)).isoformat()
    response = api.get("/api/v1/accounting/", {"group_by": "project", "from": since})
    assert response.status_code == 200, response.json()

    expected = {
        slug
        for slug, joined in (("vision", True), ("nlp", False))
        if _sees(role, "accounting.view", joined=joined)
    }
    assert {row["project"] for row in response.json()} == expected
    assert expected == ({"vision"} if role in ("member", "manager") else {"vision", "nlp"})

    client = Client()
    client.force_login(site[role])
    page = client.get("/accounting/", {"group_by": "project", "from": since}).content.decode()
    assert ("nlp" in page) == ("nlp" in expected)


@pytest.mark.parametrize("role", ROLES)
def test_it_offers_site_events_in_preferences_as_the_table_says(site, role):
    offered = {event["event"] for event in preferences_get(user=site[role])["events"]}
    allowed = permissions.can(site[role], "notify.site_events")

    assert ("node_down" in offered) is allowed
    assert ("foreign_process" in offered) is allowed
    assert allowed is (role in ("staff", "superuser"))
