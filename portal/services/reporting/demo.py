"""The seeded demo: users, two projects with quotas, three simulated nodes of 8 GPUs."""

import secrets

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import transaction

from portal.models import Membership, Project, Quota
from portal.services.fleet.nodes import node_inventory_from_spec

DEMO_PASSWORD = "gpu-demo-2026"
# hostname -> simulated agent SPEC (see docs/agent.md); one node has MIG slices.
DEMO_NODES = {
    "gpu-a01": "8xH100-80GB",
    "gpu-a02": "8xA100-80GB",
    "gpu-a03": "4xA100-80GB,4xA100-80GB:mig=3g.40gb+2g.20gb+1g.10gb+1g.10gb",
}
DEMO_USERS = [
    # username, first name, is_staff
    ("admin", "Ada", True),
    ("alice", "Alice", False),
    ("bob", "Bob", False),
    ("carol", "Carol", False),
]
DEMO_PROJECTS = [
    # slug, name, {user: role}, quota
    (
        "vision",
        "Vision lab",
        {"alice": "member", "carol": "manager"},
        {
            "max_gpus": 12,
            "gpu_hours_budget": 2000,
            "max_duration_s": 7 * 86400,
            "fairshare_shares": 2,
            "allowed_qos": ["low", "normal", "high"],
        },
    ),
    (
        "nlp",
        "Language models",
        {"bob": "member", "carol": "member"},
        {
            "max_gpus": 16,
            "gpu_hours_budget": 4000,
            "max_duration_s": 3 * 86400,
            "fairshare_shares": 1,
            "allowed_qos": ["low", "normal"],
        },
    ),
]


@transaction.atomic
def demo_seed() -> dict:
    """Create (or bring back to shape) the demo users and projects. Idempotent."""
    users = {name: _user(name, first, staff) for name, first, staff in DEMO_USERS}
    for slug, name, members, limits in DEMO_PROJECTS:
        project, _ = Project.objects.update_or_create(slug=slug, defaults={"name": name})
        for username, role in members.items():
            Membership.objects.update_or_create(
                project=project, user=users[username], defaults={"role": role}
            )
        Quota.objects.update_or_create(project=project, user=None, defaults=limits)
    return users


def demo_site_id() -> str:
    """This install's id, made once and kept in VAR_DIR/agents/site-id.

    The simulated devices' UUIDs derive from it and the hostname: `up` gives it to the demo
    agents and demo_nodes_seed builds the same devices, so a seed after the agents registered
    (every start of `up`) finds the very devices they reported.
    """
    path = settings.VAR_DIR / "agents" / "site-id"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(secrets.token_hex(8))
    return path.read_text().strip()


def demo_nodes_seed() -> list[str]:
    """Create (or leave as they are) the demo nodes with the devices their agents will report."""
    site = demo_site_id()
    for hostname, spec in DEMO_NODES.items():
        node_inventory_from_spec(hostname=hostname, spec=spec, site=site)
    return list(DEMO_NODES)


def _user(username: str, first_name: str, staff: bool):
    User = get_user_model()
    user, created = User.objects.get_or_create(
        username=username,
        defaults={
            "first_name": first_name,
            "email": f"{username}@example.org",
            "is_staff": staff,
            "is_superuser": staff,
        },
    )
    if created:
        user.set_password(DEMO_PASSWORD)
        user.save()
    return user
