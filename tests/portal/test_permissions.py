"""The roles table (permissions.CAN) is what the docs say and what the portal does."""

import re
from pathlib import Path

import pytest

from portal.errors import NotAllowed
from portal.models import Booking, Membership
from portal.services.access import permissions
from portal.services.fleet.nodes import node_drain
from tests.conftest import error_of
from tests.factories import ProjectFactory, UserFactory, make_active_booking, member

pytestmark = pytest.mark.django_db

ROLES_DOC = Path(__file__).resolve().parents[2] / "docs" / "roles.md"


def test_it_documents_exactly_the_table_the_code_enforces():
    text = ROLES_DOC.read_text()
    shown = re.search(r"<!-- roles-table:start -->\n(.*)<!-- roles-table:end -->", text, re.S)
    assert shown is not None
    assert shown.group(1) == permissions.table_markdown()


def test_it_gives_each_role_at_least_what_the_role_below_has():
    rank = {scope: i for i, scope in enumerate(permissions.SCOPES)}
    for action, (_label, cells) in permissions.CAN.items():
        reach = [rank[cells[role]] for role in permissions.ROLES]
        assert reach == sorted(reach), action
        assert set(cells) == set(permissions.ROLES)
        if "perm" in cells.values():
            assert action in permissions.PERMS


@pytest.fixture
def manager(project):
    carol = UserFactory(username="carol")
    member(carol, project, Membership.Role.MANAGER)
    return carol


@pytest.fixture
def members_booking(user, project, cluster):
    return make_active_booking([cluster[0].gpus.first()], owner=user, project=project)


def test_it_lets_a_manager_release_a_members_booking(api, manager, members_booking):
    api.force_authenticate(manager)
    response = api.post(f"/api/v1/bookings/{members_booking.pk}/release/")
    assert response.status_code == 200 and response.json()["state"] == "finished"


def test_it_refuses_a_manager_extending_a_members_booking_with_403(api, manager, members_booking):
    api.force_authenticate(manager)
    response = api.post(
        f"/api/v1/bookings/{members_booking.pk}/extend/", {"by_s": 600}, format="json"
    )
    assert response.status_code == 403 and error_of(response)["code"] == "forbidden"
    assert Booking.objects.get(pk=members_booking.pk).duration_s == members_booking.duration_s


def test_it_lets_a_manager_extend_their_own_booking(api, manager, project, cluster):
    own = make_active_booking([cluster[1].gpus.first()], owner=manager, project=project)
    api.force_authenticate(manager)
    response = api.post(f"/api/v1/bookings/{own.pk}/extend/", {"by_s": 600}, format="json")
    assert response.status_code == 200, response.json()


def test_it_lets_staff_extend_anyones_booking(api, members_booking):
    api.force_authenticate(UserFactory(username="ops", is_staff=True))
    response = api.post(
        f"/api/v1/bookings/{members_booking.pk}/extend/", {"by_s": 600}, format="json"
    )
    assert response.status_code == 200, response.json()


def test_it_hides_from_a_manager_the_buttons_the_table_refuses(client, manager, members_booking):
    client.force_login(manager)
    html = client.get(f"/bookings/{members_booking.pk}/").content.decode()
    assert f"/bookings/{members_booking.pk}/cancel/" in html
    assert f"/bookings/{members_booking.pk}/release/" in html
    assert f"/bookings/{members_booking.pk}/extend/" not in html


def test_it_refuses_a_drain_by_someone_who_is_not_staff(user, cluster):
    with pytest.raises(NotAllowed):
        node_drain(node_ids=[cluster[0].pk], actor=user)
    cluster[0].refresh_from_db()
    assert cluster[0].state == "up"


def test_it_lets_staff_drain_only_with_the_node_permission(cluster):
    from django.contrib.auth.models import Permission

    ops = UserFactory(username="ops", is_staff=True)
    with pytest.raises(NotAllowed):
        node_drain(node_ids=[cluster[0].pk], actor=ops)
    ops.user_permissions.add(Permission.objects.get(codename="change_node"))
    ops = type(ops).objects.get(pk=ops.pk)  # permissions are cached on the user object
    assert node_drain(node_ids=[cluster[0].pk], actor=ops) == 1


def test_it_counts_a_manager_of_another_project_as_a_member_here(api, user, members_booking):
    outsider = UserFactory(username="frank")
    member(outsider, ProjectFactory(slug="other"), Membership.Role.MANAGER)
    api.force_authenticate(outsider)
    assert api.post(f"/api/v1/bookings/{members_booking.pk}/cancel/").status_code == 404
    assert not permissions.can(
        outsider,
        "booking.cancel",
        owner_id=user.pk,
        project_id=members_booking.project_id,
    )


@pytest.mark.parametrize(
    ("who", "status", "links"),
    [
        ("member", 403, set()),
        ("manager", 403, {"/audit/"}),
        ("staff", 200, {"/audit/", "/staff/", "/admin/"}),
        ("superuser", 200, {"/audit/", "/staff/", "/admin/"}),
    ],
)
def test_it_opens_the_staff_panel_and_its_links_by_the_table(
    client, user, project, manager, who, status, links
):
    people = {
        "member": user,
        "manager": manager,
        "staff": UserFactory(username="ops", is_staff=True),
        "superuser": UserFactory(username="root", is_staff=True, is_superuser=True),
    }
    assert permissions.CAN["staff.panel"][1][who] == ("all" if status == 200 else "no")
    client.force_login(people[who])
    assert client.get("/staff/").status_code == status
    page = client.get("/queue/").content.decode()
    shown = {href for href in ("/audit/", "/staff/", "/admin/") if f'href="{href}"' in page}
    assert shown == links
