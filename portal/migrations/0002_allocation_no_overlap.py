"""No double booking, enforced by PostgreSQL.

An exclusion constraint over (device, time range) on live allocations: no code path, not even a
race, can give one device to two bookings at once. A device is (gpu, MIG instance or 0 for the
whole GPU). Written as SQL run only on PostgreSQL because SQLite (the embedded demo) has no
exclusion constraints; the model state does not carry it, so makemigrations stays quiet.
"""

from django.contrib.postgres.operations import BtreeGistExtension
from django.db import migrations

CONSTRAINT = "portal_allocation_no_overlap"

ADD = f"""
ALTER TABLE portal_allocation ADD CONSTRAINT {CONSTRAINT}
EXCLUDE USING gist (
    gpu_id WITH =,
    (COALESCE(mig_instance_id, 0)) WITH =,
    tstzrange(start, "end", '[)') WITH &&
) WHERE (live)
"""
DROP = f"ALTER TABLE portal_allocation DROP CONSTRAINT IF EXISTS {CONSTRAINT}"


def _on_postgres(sql):
    def run(apps, schema_editor):
        if schema_editor.connection.vendor == "postgresql":
            schema_editor.execute(sql)

    return run


class Migration(migrations.Migration):
    dependencies = [("portal", "0001_initial")]

    operations = [
        BtreeGistExtension(),
        migrations.RunPython(_on_postgres(ADD), _on_postgres(DROP)),
    ]
