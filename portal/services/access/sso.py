"""Single sign-on: users from an identity provider, and their projects from its groups.

OpenID Connect and LDAP sign-ins both end here: the user's groups, as the provider names them, go
through the admin's GroupMappingRules to give project memberships. Memberships a rule made follow
the groups at every sign-in; memberships an admin made by hand are never changed or removed.
"""

from collections.abc import Iterable
from dataclasses import dataclass
from fnmatch import fnmatchcase

from django.contrib.auth import get_user_model
from django.db import transaction

from portal.models import GroupMappingRule, Membership
from portal.services.access.audit import audit_record

_ROLE_RANK = {Membership.Role.MEMBER: 0, Membership.Role.MANAGER: 1}


@dataclass(frozen=True)
class SyncResult:
    """Project slugs whose rule-made membership was added, changed role, or removed."""

    added: tuple[str, ...]
    changed: tuple[str, ...]
    removed: tuple[str, ...]


def grants_for_groups(*, groups: Iterable[str], source: str) -> dict[int, str]:
    """Project id -> role that the mapping rules give to someone in `groups` signing in by `source`."""
    groups = list(groups)
    grants: dict[int, str] = {}
    rules = GroupMappingRule.objects.filter(source__in=[source, GroupMappingRule.Source.ANY])
    for rule in rules.order_by("id"):
        if not any(fnmatchcase(group, rule.group) for group in groups):
            continue
        held = grants.get(rule.project_id)
        if held is None or _ROLE_RANK[rule.role] > _ROLE_RANK[held]:
            grants[rule.project_id] = rule.role
    return grants


def memberships_sync(*, user, groups: Iterable[str], source: str) -> SyncResult:
    """Make the user's rule-made memberships match what the rules give `groups` now.

    Adds missing ones, updates their role, removes those no rule grants any more. A membership
    made by hand (granted_by_rule False) is left exactly as it is, even when a rule covers it.
    """
    grants = grants_for_groups(groups=groups, source=source)
    added, changed, removed = [], [], []
    with transaction.atomic():
        # One sign-in of a user at a time (the user's row is the lock): two at once would both
        # add the same membership. Project rows are not locked.
        list(get_user_model().objects.select_for_update().filter(pk=user.pk).values("pk"))
        memberships = Membership.objects.filter(user=user).select_related("project")
        held = {m.project_id: m for m in memberships.order_by("id")}
        for membership in held.values():
            if not membership.granted_by_rule:
                continue
            role = grants.get(membership.project_id)
            if role is None:
                _audit(membership, source, before=membership.role, after=None)
                membership.delete()
                removed.append(membership.project.slug)
            elif role != membership.role:
                _audit(membership, source, before=membership.role, after=role)
                membership.role = role
                membership.save(update_fields=["role"])
                changed.append(membership.project.slug)
        for project_id, role in sorted(grants.items()):
            if project_id not in held:
                membership = Membership.objects.create(
                    user=user, project_id=project_id, role=role, granted_by_rule=True
                )
                _audit(membership, source, before=None, after=role)
                added.append(membership.project.slug)
    return SyncResult(added=tuple(added), changed=tuple(changed), removed=tuple(removed))


def _audit(membership: Membership, source: str, *, before: str | None, after: str | None) -> None:
    action = "membership.change" if before and after else "membership.create"
    if after is None:
        action = "membership.delete"

    def state(role):
        return None if role is None else {"user": membership.user.username, "role": role}

    audit_record(
        action=action,
        actor_name=f"{source} group rules",
        target=membership,
        project=membership.project,
        before=state(before),
        after=state(after),
    )


@dataclass(frozen=True)
class Identity:
    """Who signed in, as the identity provider describes them."""

    username: str
    email: str = ""
    first_name: str = ""
    last_name: str = ""
    groups: tuple[str, ...] = ()


def sso_user_provision(*, identity: Identity, source: str, create: bool = True):
    """The user `identity` names, created on first sign-in (when `create`), with the provider's
    email and names copied in and memberships synced to its groups. None when absent and not
    `create`."""
    User = get_user_model()
    with transaction.atomic():
        user = User.objects.select_for_update().filter(username=identity.username).first()
        if user is None:
            if not create:
                return None
            user = User(username=identity.username)
            user.set_unusable_password()
        # What the provider leaves out keeps the value the portal has.
        user.email = identity.email[:254] or user.email
        user.first_name = identity.first_name[:150] or user.first_name
        user.last_name = identity.last_name[:150] or user.last_name
        user.save()
        memberships_sync(user=user, groups=identity.groups, source=source)
    return user
