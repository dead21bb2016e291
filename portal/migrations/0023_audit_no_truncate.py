"""The audit log refuses TRUNCATE too (PostgreSQL; SQLite has no TRUNCATE): a statement-level
BEFORE TRUNCATE trigger, next to the row triggers of 0010 that refuse UPDATE and DELETE.

It refuses every role but a superuser: a superuser can switch any trigger off anyway, so
refusing it would protect nothing, and the test runner's flush (TRUNCATE, as the superuser
`postgres`) must still empty the database between tests. The portal connects as a role that is
neither a superuser nor the owner (docs/audit.md)."""

from django.db import migrations

NO_TRUNCATE = [
    """
    CREATE FUNCTION portal_auditevent_no_truncate() RETURNS trigger AS $$
    BEGIN
        IF (SELECT rolsuper FROM pg_roles WHERE rolname = session_user) THEN
            RETURN NULL;
        END IF;
        RAISE EXCEPTION 'the audit log is append only (TRUNCATE refused)';
    END;
    $$ LANGUAGE plpgsql
    """,
    """
    CREATE TRIGGER portal_auditevent_no_truncate
        BEFORE TRUNCATE ON portal_auditevent
        FOR EACH STATEMENT EXECUTE FUNCTION portal_auditevent_no_truncate()
    """,
]
UNDO = [
    "DROP TRIGGER IF EXISTS portal_auditevent_no_truncate ON portal_auditevent",
    "DROP FUNCTION IF EXISTS portal_auditevent_no_truncate()",
]


def _no_truncate(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        for statement in NO_TRUNCATE:
            schema_editor.execute(statement)


def _undo(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        for statement in UNDO:
            schema_editor.execute(statement)


class Migration(migrations.Migration):
    dependencies = [("portal", "0022_node_registered_from_auditevent_via")]

    operations = [migrations.RunPython(_no_truncate, _undo)]
