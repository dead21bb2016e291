"""`manage.py app_role`: the database, its tables and the role the portal connects as, for server
mode outside compose (docs/audit.md, "Setting up the roles").

Run it once with DATABASE_URL naming the role that owns the tables (a PostgreSQL superuser,
say): it creates the database if it does not exist (as `up` does), migrates as that role, and
runs deploy/postgres/app-role.sql, the script compose runs, with its psql variables filled in:
a login role (``--role``, default portal_app) that is no superuser and owns nothing, with the
password PORTAL_APP_DB_PASSWORD (or the file PORTAL_APP_DB_PASSWORD_FILE). The portal then
runs with DATABASE_URL naming that role, so the audit log's triggers hold against it.
"""

import re

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError
from django.db import connection, transaction
from psycopg import sql

from portal.env import SettingError, env
from portal.management.commands.up import database_ensure

ROLE_SQL = settings.BASE_DIR / "deploy" / "postgres" / "app-role.sql"
_VARIABLE = re.compile(r""":"(\w+)"|:'(\w+)'""")


def app_role_sql(*, role: str, password: str, owner: str, database: str) -> str:
    """deploy/postgres/app-role.sql with its psql variables filled in, as ``psql -v`` does:
    ``:"name"`` an identifier, ``:'name'`` a literal, each quoted."""
    values = {"app_role": role, "app_password": password, "owner_role": owner, "database": database}

    def fill(match: re.Match) -> str:
        if match[1]:
            return sql.Identifier(values[match[1]]).as_string(None)
        return sql.Literal(values[match[2]]).as_string(None)

    return _VARIABLE.sub(fill, ROLE_SQL.read_text())


class Command(BaseCommand):
    help = (
        "Create the database if missing, migrate, and create the role the portal connects as "
        "(no superuser, owns nothing). Run as the tables' owner."
    )

    def add_arguments(self, parser):
        parser.add_argument("--role", default="portal_app", help="The role to create.")

    def handle(self, *args, role, **options):
        if connection.vendor != "postgresql":
            raise CommandError("app_role is for PostgreSQL (DATABASE_URL=postgres://...).")
        password = _password()
        database_ensure()
        database = connection.settings_dict["NAME"]
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", [role])
            if cursor.fetchone():
                raise CommandError(f"Role {role} exists already; it was left as it is.")
            cursor.execute("SELECT current_user")
            (owner,) = cursor.fetchone()
        call_command("migrate", interactive=False, verbosity=0)
        script = app_role_sql(role=role, password=password, owner=owner, database=database)
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(script)
        self.stdout.write(
            f"Role {role} created: it may read and write the tables {owner} owns, and owns none. "
            f"Run the portal with DATABASE_URL=postgres://{role}:...@.../{database}; "
            f"migrate as {owner}."
        )


def _password() -> str:
    try:
        password = env("PORTAL_APP_DB_PASSWORD")
    except SettingError as exc:
        raise CommandError(str(exc)) from None
    if not password:
        raise CommandError("Set PORTAL_APP_DB_PASSWORD_FILE (or PORTAL_APP_DB_PASSWORD).")
    return password
