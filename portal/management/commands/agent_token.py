from django.core.management.base import BaseCommand, CommandError

from portal.errors import ValidationFailed
from portal.services.fleet.nodes import node_token_issue, node_token_revoke


class Command(BaseCommand):
    help = "Print a new agent token for a node (creating the node if needed), or revoke it."

    def add_arguments(self, parser):
        parser.add_argument("hostname")
        parser.add_argument(
            "--revoke", action="store_true", help="Revoke the node's token instead."
        )

    def handle(self, *args, hostname, revoke, **options):
        if revoke:
            if not node_token_revoke(hostname=hostname):
                raise CommandError(f"No node named {hostname}.")
            self.stdout.write(f"Token of {hostname} revoked.")
            return
        try:
            self.stdout.write(node_token_issue(hostname=hostname))
        except ValidationFailed as exc:
            raise CommandError(exc.message) from None
