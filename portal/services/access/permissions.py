"""Who may do what: one table, read by every check in the portal and printed in docs/roles.md.

Roles, from least to most: a project member, a project manager (of the booking's or the
event's project), staff (admins; what they change in /admin/ also needs the Django model
permission named in PERMS) and the superuser. A cell says how far the right reaches:

- "no": not at all;
- "own": the user's own bookings or tokens (for booking.submit: in projects they belong to);
- "project": also everything of the projects they manage;
- "joined": everything of the projects they belong to (as member or manager);
- "perm": everything, with the Django permission in PERMS (staff in /admin/);
- "all": everything.
"""

from django.db.models import Q

from portal.models import Membership

ROLES = ("member", "manager", "staff", "superuser")
SCOPES = ("no", "own", "project", "joined", "perm", "all")

# action: (what it is, {role: scope})
CAN: dict[str, tuple[str, dict[str, str]]] = {
    "booking.submit": (
        "Book GPUs or MIG slices",
        {"member": "own", "manager": "own", "staff": "own", "superuser": "own"},
    ),
    "booking.view": (
        "See bookings",
        {"member": "own", "manager": "project", "staff": "all", "superuser": "all"},
    ),
    "booking.cancel": (
        "Cancel a booking",
        {"member": "own", "manager": "project", "staff": "all", "superuser": "all"},
    ),
    "booking.release": (
        "Release an active booking early",
        {"member": "own", "manager": "project", "staff": "all", "superuser": "all"},
    ),
    "booking.extend": (
        "Extend a booking",
        {"member": "own", "manager": "own", "staff": "all", "superuser": "all"},
    ),
    "quota.edit": (
        "Set quotas and memberships (/admin/)",
        {"member": "no", "manager": "no", "staff": "perm", "superuser": "all"},
    ),
    "node.drain": (
        "Drain a node or return it to service (/admin/)",
        {"member": "no", "manager": "no", "staff": "perm", "superuser": "all"},
    ),
    "maintenance.edit": (
        "Create, change or delete a maintenance window (/admin/, API)",
        {"member": "no", "manager": "no", "staff": "perm", "superuser": "all"},
    ),
    "gpu.sharing": (
        "Put GPUs in sharing mode or back to exclusive",
        {"member": "no", "manager": "no", "staff": "perm", "superuser": "all"},
    ),
    "audit.view": (
        "Read the audit log",
        {"member": "no", "manager": "project", "staff": "all", "superuser": "all"},
    ),
    "token.manage": (
        "Create, list and revoke API tokens",
        {"member": "own", "manager": "own", "staff": "own", "superuser": "own"},
    ),
    "token.revoke_any": (
        "Revoke anyone's API token (/admin/)",
        {"member": "no", "manager": "no", "staff": "perm", "superuser": "all"},
    ),
    "staff.panel": (
        "Open the staff panel (/staff/: nodes and open alerts)",
        {"member": "no", "manager": "no", "staff": "all", "superuser": "all"},
    ),
    "project.view": (
        "See a project's page (limits, use, members)",
        {"member": "joined", "manager": "joined", "staff": "all", "superuser": "all"},
    ),
    "accounting.view": (
        "Read GPU accounting (page and API)",
        {"member": "joined", "manager": "joined", "staff": "all", "superuser": "all"},
    ),
    "notify.site_events": (
        "Choose notifications of site events (node down, foreign process)",
        {"member": "no", "manager": "no", "staff": "all", "superuser": "all"},
    ),
    "gpu.mig_layout": (
        "Change a GPU's MIG layout, approve or cancel a change (API, /admin/)",
        {"member": "no", "manager": "no", "staff": "perm", "superuser": "all"},
    ),
}

# The Django model permission a "perm" cell asks for.
PERMS = {
    "quota.edit": "portal.change_quota",
    "node.drain": "portal.change_node",
    "maintenance.edit": "portal.change_maintenancewindow",
    "gpu.sharing": "portal.change_gpu",
    "token.revoke_any": "portal.delete_apitoken",
    "gpu.mig_layout": "portal.change_gpu",
}


def role_of(user, project_id: int | None = None, managed: set[int] | None = None) -> str:
    """The user's highest role: superuser, staff, manager of `project_id`, else member."""
    if user.is_superuser:
        return "superuser"
    if user.is_staff:
        return "staff"
    if project_id is not None:
        if managed is None:
            managed = managed_project_ids(user)
        if project_id in managed:
            return "manager"
    return "member"


def managed_project_ids(user) -> set[int]:
    """The projects the user manages."""
    return set(
        Membership.objects.filter(user=user, role=Membership.Role.MANAGER).values_list(
            "project_id", flat=True
        )
    )


def can(
    user,
    action: str,
    *,
    owner_id: int | None = None,
    project_id: int | None = None,
    managed: set[int] | None = None,
) -> bool:
    """Whether `user` may do `action` on something owned by `owner_id` in `project_id`.

    `managed` (the user's managed projects) may be passed in when asking for many objects."""
    if not user.is_authenticated:
        return False
    if user.is_superuser or user.is_staff:
        managed = set()
    elif managed is None:
        managed = managed_project_ids(user)
    reach = CAN[action][1][role_of(user, project_id, managed)]
    if reach == "all":
        return True
    if reach == "perm":
        return user.has_perm(PERMS[action])
    if reach == "no":
        return False
    if reach == "joined":
        return Membership.objects.filter(user=user, project_id=project_id).exists()
    if owner_id is None or owner_id == user.pk:
        return True
    return reach == "project" and project_id in managed


def can_some(user, action: str) -> bool:
    """Whether `user` may do `action` to anything at all (e.g. read some of the audit log)."""
    if not user.is_authenticated:
        return False
    broad = CAN[action][1][role_of(user)]
    if broad == "perm":
        return user.has_perm(PERMS[action])
    if broad != "no":
        return True
    return CAN[action][1]["manager"] == "project" and bool(managed_project_ids(user))


def visible_filter(user, action: str, *, owner_field: str | None, project_field: str) -> Q | None:
    """A filter for the rows `user` may `action` across projects; None means every row."""
    broad = CAN[action][1][role_of(user)]
    if broad == "all" or (broad == "perm" and user.has_perm(PERMS[action])):
        return None
    if broad == "joined":
        return Q(
            **{f"{project_field}__in": Membership.objects.filter(user=user).values("project_id")}
        )
    parts = []
    if owner_field and broad != "no":
        parts.append(Q(**{owner_field: user}))
    if CAN[action][1]["manager"] == "project":
        # Read as a list first: for a user who manages nothing the filter is then only the
        # owner's, which an index answers, where an OR with a subquery scans every row.
        managed = managed_project_ids(user)
        if managed:
            parts.append(Q(**{f"{project_field}__in": sorted(managed)}))
    if not parts:
        return Q(pk__in=[])
    match = parts[0]
    for part in parts[1:]:
        match |= part
    return match


def site_wide_users_filter(action: str) -> Q:
    """A filter on users for whom `action` reaches everything by role alone (no project, no
    owner): the recipients of a site event. "perm" cells are left out (a model permission is not
    a role), and so are member and manager cells, which need a project to mean anything."""
    cells = CAN[action][1]
    match = Q(pk__in=[])
    if cells["superuser"] == "all":
        match |= Q(is_superuser=True)
    if cells["staff"] == "all":
        match |= Q(is_staff=True)
    return match


def table_markdown() -> str:
    """The table as Markdown, as docs/roles.md shows it."""
    lines = [
        "| Action | " + " | ".join(ROLES) + " |",
        "|---|" + "---|" * len(ROLES),
    ]
    for action, (label, cells) in CAN.items():
        lines.append(f"| {label} (`{action}`) | " + " | ".join(cells[r] for r in ROLES) + " |")
    return "\n".join(lines) + "\n"
