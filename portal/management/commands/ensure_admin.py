"""`manage.py ensure_admin`: the first superuser from PORTAL_ADMIN_USERNAME and a password.

The password comes from PORTAL_ADMIN_PASSWORD or, better, a file named by
PORTAL_ADMIN_PASSWORD_FILE (a Docker secret). Nothing is asked for when PORTAL_ADMIN_USERNAME is
unset; an existing account is left as it is. docker-compose's migrate service runs it every start.
"""

import os

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError

from portal.services.access.accounts import admin_ensure


class Command(BaseCommand):
    help = "Create the first superuser from PORTAL_ADMIN_* environment variables (idempotent)."

    def handle(self, *args, **options):
        username = os.environ.get("PORTAL_ADMIN_USERNAME", "").strip()
        if not username:
            self.stdout.write("PORTAL_ADMIN_USERNAME is not set: no administrator created.")
            return
        try:
            created = admin_ensure(
                username=username,
                email=os.environ.get("PORTAL_ADMIN_EMAIL", "").strip(),
                password=_password(),
            )
        except ValidationError as exc:
            raise CommandError(f"Administrator {username}: {' '.join(exc.messages)}") from None
        verb = "created" if created else "already exists; left unchanged"
        self.stdout.write(f"Administrator {username} {verb}.")


def _password() -> str:
    path = os.environ.get("PORTAL_ADMIN_PASSWORD_FILE", "").strip()
    if path:
        try:
            with open(path, encoding="utf-8") as f:
                return f.read().strip()
        except OSError as exc:
            raise CommandError(f"PORTAL_ADMIN_PASSWORD_FILE: {exc.strerror}: {path}") from None
    password = os.environ.get("PORTAL_ADMIN_PASSWORD", "")
    if not password:
        raise CommandError("Set PORTAL_ADMIN_PASSWORD_FILE (or PORTAL_ADMIN_PASSWORD).")
    return password
