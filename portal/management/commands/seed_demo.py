from django.core.management.base import BaseCommand

from portal.services.demo import DEMO_NODES, DEMO_PASSWORD, demo_seed
from portal.services.nodes import node_inventory_from_spec


class Command(BaseCommand):
    help = "Create the demo users, projects, quotas and simulated nodes (idempotent)."

    def handle(self, *args, **options):
        users = demo_seed()
        for hostname, spec in DEMO_NODES.items():
            node_inventory_from_spec(hostname=hostname, spec=spec)
        self.stdout.write(
            self.style.SUCCESS(
                f"Demo ready: users {', '.join(users)} (password {DEMO_PASSWORD}), nodes {', '.join(DEMO_NODES)}."
            )
        )
