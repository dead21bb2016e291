"""Group mapping rules -> project memberships, as both sign-in ways apply them."""

import pytest

from portal.models import AuditEvent, GroupMappingRule, Membership
from portal.services.access.sso import Identity, memberships_sync, sso_user_provision
from tests.factories import ProjectFactory, UserFactory, member

OIDC = GroupMappingRule.Source.OIDC
LDAP = GroupMappingRule.Source.LDAP


@pytest.fixture
def projects(db):
    return {slug: ProjectFactory(slug=slug) for slug in ("vision", "nlp", "hpc")}


def _rule(group, project, role="member", source="any"):
    return GroupMappingRule.objects.create(group=group, project=project, role=role, source=source)


def _held(user) -> dict[str, str]:
    return dict(Membership.objects.filter(user=user).values_list("project__slug", "role"))


def test_it_matches_patterns_and_gives_the_highest_role_of_matching_rules(projects):
    _rule("lab-*", projects["vision"])
    _rule("vision-admins", projects["vision"], role="manager")
    _rule("hpc-[ab]", projects["hpc"])
    user = UserFactory()

    result = memberships_sync(user=user, groups=["lab-cv", "vision-admins", "hpc-c"], source=OIDC)

    assert _held(user) == {"vision": "manager"}
    assert result.added == ("vision",)


def test_it_applies_a_rule_only_to_its_own_source(projects):
    _rule("staff", projects["vision"], source=LDAP)
    _rule("staff", projects["nlp"], source=OIDC)
    user = UserFactory()

    memberships_sync(user=user, groups=["staff"], source=LDAP)

    assert _held(user) == {"vision": "member"}


def test_it_changes_the_role_and_removes_what_no_rule_grants_any_more(projects):
    _rule("a", projects["vision"])
    rule_b = _rule("b", projects["nlp"])
    user = UserFactory()
    memberships_sync(user=user, groups=["a", "b"], source=OIDC)

    GroupMappingRule.objects.filter(group="a").update(role="manager")
    rule_b.delete()
    result = memberships_sync(user=user, groups=["a", "b"], source=OIDC)

    assert _held(user) == {"vision": "manager"}
    assert (result.changed, result.removed) == (("vision",), ("nlp",))


def test_it_audits_each_membership_a_rule_adds_changes_or_removes(projects):
    _rule("a", projects["vision"])
    rule_b = _rule("b", projects["nlp"])
    user = UserFactory(username="dana")
    memberships_sync(user=user, groups=["a", "b"], source=OIDC)
    GroupMappingRule.objects.filter(group="a").update(role="manager")
    rule_b.delete()
    memberships_sync(user=user, groups=["a", "b"], source=OIDC)

    rows = AuditEvent.objects.order_by("id").values_list(
        "action", "project__slug", "actor_name", "before", "after"
    )
    dana = {"user": "dana"}
    assert list(rows) == [
        ("membership.create", "vision", "oidc group rules", None, {**dana, "role": "member"}),
        ("membership.create", "nlp", "oidc group rules", None, {**dana, "role": "member"}),
        (
            "membership.change",
            "vision",
            "oidc group rules",
            {**dana, "role": "member"},
            {**dana, "role": "manager"},
        ),
        ("membership.delete", "nlp", "oidc group rules", {**dana, "role": "member"}, None),
    ]


def test_it_never_changes_or_removes_a_membership_made_by_hand(projects):
    _rule("a", projects["vision"], role="manager")
    user = UserFactory()
    member(user, projects["vision"])
    member(user, projects["hpc"], role="manager")

    result = memberships_sync(user=user, groups=["a"], source=OIDC)

    assert _held(user) == {"vision": "member", "hpc": "manager"}
    assert result == type(result)(added=(), changed=(), removed=())


def test_it_keeps_the_portal_s_values_for_what_the_provider_leaves_out(projects):
    user = UserFactory(username="ivy", email="ivy@site.example", first_name="Ivy")

    same = sso_user_provision(identity=Identity(username="ivy", last_name="Lee"), source=OIDC)

    assert same.pk == user.pk
    same.refresh_from_db()
    assert (same.email, same.first_name, same.last_name) == ("ivy@site.example", "Ivy", "Lee")
    assert sso_user_provision(identity=Identity(username="new"), source=OIDC, create=False) is None
