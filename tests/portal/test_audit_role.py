"""The audit log against its own database role: TRUNCATE refused by a trigger, and the role
the portal connects as (deploy/postgres/app-role.sql, as compose sets it up) can neither
truncate, nor switch triggers off, nor change or delete a row."""

import re

import psycopg
import pytest
from django.conf import settings
from django.db import connection

from portal.models import AuditEvent
from portal.services.access.audit import audit_record

ROLE_SQL = settings.BASE_DIR / "deploy" / "postgres" / "app-role.sql"


def _role_sql(role: str, password: str, owner: str, database: str) -> str:
    """app-role.sql with its psql variables filled in, as psql -v does."""
    text = ROLE_SQL.read_text()
    values = {"app_role": role, "owner_role": owner, "database": database}
    text = re.sub(r':"(\w+)"', lambda m: '"' + values[m[1]] + '"', text)
    return text.replace(":'app_password'", "'" + password.replace("'", "''") + "'")


@pytest.fixture
def app_role(transactional_db):
    """The portal's non-owner role on the test database, made by the compose script's SQL."""
    database = connection.settings_dict["NAME"]
    role = f"portal_app_{settings.TEST_RUN_ID}"[:60].lower()
    admin = psycopg.connect(f"postgresql://postgres@127.0.0.1:5432/{database}", autocommit=True)
    admin.execute(f'DROP OWNED BY "{role}"') if _exists(admin, role) else None
    admin.execute(f'DROP ROLE IF EXISTS "{role}"')
    admin.execute(_role_sql(role, "pw", "postgres", database))
    yield f"postgresql://{role}:pw@127.0.0.1:5432/{database}", admin, role
    admin.execute(f'DROP OWNED BY "{role}"')
    admin.execute(f'DROP ROLE IF EXISTS "{role}"')
    admin.close()


def _exists(admin, role: str) -> bool:
    return admin.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", [role]).fetchone() is not None


@pytest.mark.parametrize(
    "attack",
    [
        ["TRUNCATE portal_auditevent"],
        ["SET LOCAL session_replication_role = replica", "DELETE FROM portal_auditevent"],
        [
            "ALTER TABLE portal_auditevent DISABLE TRIGGER ALL",
            "UPDATE portal_auditevent SET after = '{}'",
        ],
        ["UPDATE portal_auditevent SET actor_name = 'nobody'"],
        ["DELETE FROM portal_auditevent"],
        ["DROP TRIGGER portal_auditevent_append_only ON portal_auditevent"],
    ],
)
def test_it_holds_against_the_role_the_portal_connects_as(app_role, attack):
    event = audit_record(action="login", after={"x": 1})
    with psycopg.connect(app_role[0]) as portal:
        # The role does what the portal needs: it reads and appends.
        portal.execute("SELECT count(*) FROM portal_auditevent").fetchone()
        with pytest.raises(psycopg.Error), portal.transaction():
            for statement in attack:
                portal.execute(statement)
    event.refresh_from_db()
    assert AuditEvent.objects.count() == 1 and event.after == {"x": 1}


def test_it_refuses_truncate_by_trigger_to_a_role_granted_it(app_role):
    url, admin, role = app_role
    audit_record(action="login", after={"x": 1})
    admin.execute(f'GRANT TRUNCATE ON portal_auditevent TO "{role}"')  # a site granted too much
    with psycopg.connect(url) as portal:
        with pytest.raises(psycopg.Error, match="append only"), portal.transaction():
            portal.execute("TRUNCATE portal_auditevent")
    assert AuditEvent.objects.count() == 1
