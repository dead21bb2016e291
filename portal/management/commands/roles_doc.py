"""Write the roles table (permissions.CAN) into docs/roles.md, between its markers."""

import re
from pathlib import Path

from django.conf import settings
from django.core.management.base import BaseCommand

from portal.services.access.permissions import table_markdown

START, END = "<!-- roles-table:start -->\n", "<!-- roles-table:end -->"


class Command(BaseCommand):
    help = "Render docs/roles.md's table from portal.services.access.permissions.CAN."

    def handle(self, *args, **options):
        path = Path(settings.BASE_DIR) / "docs" / "roles.md"
        text = path.read_text()
        pattern = re.compile(re.escape(START) + ".*?" + re.escape(END), re.S)
        if not pattern.search(text):
            raise SystemExit(f"{path}: no {START.strip()} ... {END} markers")
        path.write_text(pattern.sub(lambda _: START + table_markdown() + END, text, count=1))
        self.stdout.write(f"wrote {path}")
