from django.core.management.base import BaseCommand
from django.utils import timezone

from portal.services.reporting.demo import (
    DEMO_PASSWORD,
    demo_nodes_seed,
    demo_reservation_seed,
    demo_seed,
)


class Command(BaseCommand):
    help = (
        "Create the demo users, projects, quotas, simulated nodes and weekly project reservation"
        " (idempotent)."
    )

    def handle(self, *args, **options):
        users = demo_seed()
        nodes = demo_nodes_seed()
        demo_reservation_seed(now=timezone.now())
        self.stdout.write(
            self.style.SUCCESS(
                f"Demo ready: users {', '.join(users)} (password {DEMO_PASSWORD}), nodes {', '.join(nodes)}."
            )
        )
