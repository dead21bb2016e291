from django.core.management.base import BaseCommand

from portal.services.reporting.demo import DEMO_PASSWORD, demo_nodes_seed, demo_seed


class Command(BaseCommand):
    help = "Create the demo users, projects, quotas and simulated nodes (idempotent)."

    def handle(self, *args, **options):
        users = demo_seed()
        nodes = demo_nodes_seed()
        self.stdout.write(
            self.style.SUCCESS(
                f"Demo ready: users {', '.join(users)} (password {DEMO_PASSWORD}), nodes {', '.join(nodes)}."
            )
        )
