"""The audit log against its own database role: TRUNCATE refused by a trigger, and the role
the portal connects as (deploy/postgres/app-role.sql, as compose and `manage.py app_role` set it
up) can neither truncate, nor switch triggers off, nor change or delete a row."""

import os
import subprocess
import sys

import psycopg
import pytest
from django.conf import settings
from django.db import connection

from portal.management.commands.app_role import app_role_sql
from portal.models import AuditEvent
from portal.services.access.audit import audit_record


@pytest.fixture
def app_role(transactional_db):
    """The portal's non-owner role on the test database, made by the compose script's SQL."""
    database = connection.settings_dict["NAME"]
    role = f"portal_app_{settings.TEST_RUN_ID}"[:60].lower()
    admin = psycopg.connect(f"postgresql://postgres@127.0.0.1:5432/{database}", autocommit=True)
    admin.execute(f'DROP OWNED BY "{role}"') if _exists(admin, role) else None
    admin.execute(f'DROP ROLE IF EXISTS "{role}"')
    admin.execute(app_role_sql(role=role, password="pw", owner="postgres", database=database))
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


ATTACKS = [
    "TRUNCATE portal_auditevent",
    "ALTER TABLE portal_auditevent DISABLE TRIGGER ALL",
    "SET session_replication_role = replica",
    "DELETE FROM portal_auditevent",
]


def _manage(*argv: str, **env: str) -> subprocess.CompletedProcess:
    environment = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    environment.update(DJANGO_SETTINGS_MODULE="portal.settings", DEBUG="1", **env)
    return subprocess.run(
        [sys.executable, "manage.py", *argv],
        cwd=settings.BASE_DIR,
        env=environment,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.fixture
def server_database():
    """A database of its own, and a role name of its own, dropped afterwards."""
    name = f"gpuportal_role_{settings.TEST_RUN_ID}"
    role = f"portal_srv_{settings.TEST_RUN_ID}"
    admin = psycopg.connect("postgresql://postgres@127.0.0.1:5432/postgres", autocommit=True)

    def drop() -> None:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.execute(f'DROP ROLE IF EXISTS "{role}"')

    drop()
    yield name, role
    drop()
    admin.close()


def test_it_sets_up_server_mode_to_run_as_a_role_that_cannot_touch_the_audit_log(
    server_database,
):
    """The README's server mode: `manage.py app_role` as a superuser creates the database,
    migrates and makes the role; the portal then migrates (nothing to do) and writes as it, and
    the role can neither truncate the audit log nor switch its triggers off."""
    name, role = server_database
    owner_url = f"postgres://postgres@127.0.0.1:5432/{name}"
    made = _manage("app_role", "--role", role, DATABASE_URL=owner_url, PORTAL_APP_DB_PASSWORD="pw")
    assert made.returncode == 0, made.stderr
    assert f"Role {role} created" in made.stdout
    app_url = f"postgres://{role}:pw@127.0.0.1:5432/{name}"
    assert _manage("migrate", DATABASE_URL=app_url).returncode == 0
    admin = _manage(
        "ensure_admin",
        DATABASE_URL=app_url,
        PORTAL_ADMIN_USERNAME="root-of-site",
        PORTAL_ADMIN_PASSWORD="a-long-enough-Pass-9",
    )
    assert admin.returncode == 0 and "created" in admin.stdout, admin.stderr
    record = "from portal.services.access.audit import audit_record; audit_record(action='login')"
    assert _manage("shell", "-c", record, DATABASE_URL=app_url).returncode == 0
    with psycopg.connect(app_url) as portal:
        rolsuper = portal.execute("SELECT rolsuper FROM pg_roles WHERE rolname = current_user")
        assert rolsuper.fetchone() == (False,)
        for attack in ATTACKS:
            with pytest.raises(psycopg.Error), portal.transaction():
                portal.execute(attack)
        assert portal.execute("SELECT count(*) FROM portal_auditevent").fetchone() == (1,)
    again = _manage("app_role", "--role", role, DATABASE_URL=owner_url, PORTAL_APP_DB_PASSWORD="pw")
    assert again.returncode != 0 and f"Role {role} exists already" in again.stderr
