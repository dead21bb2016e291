"""Room on each page of the booking table for HOT updates.

Every allocation pass rewrites the planned start, position, reason and priority of the pending
bookings whose plan changed, most of the queue on a busy site. With full pages each such update
writes a new tuple elsewhere and a new entry in every index of the table (five); with free room
on the page PostgreSQL updates in place (a heap-only tuple) and leaves the indexes alone, since
none of those columns is indexed.
"""

from django.db import migrations

FILLFACTOR = 60


def _set(apps, schema_editor, value: int | None) -> None:
    if schema_editor.connection.vendor != "postgresql":
        return  # SQLite has no fillfactor
    table = schema_editor.quote_name(apps.get_model("portal", "Booking")._meta.db_table)
    if value is None:
        schema_editor.execute(f"ALTER TABLE {table} RESET (fillfactor)")
    else:
        schema_editor.execute(f"ALTER TABLE {table} SET (fillfactor = {value})")


def forwards(apps, schema_editor):
    _set(apps, schema_editor, FILLFACTOR)


def backwards(apps, schema_editor):
    _set(apps, schema_editor, None)


class Migration(migrations.Migration):
    dependencies = [("portal", "0004_allocation_slots")]

    operations = [migrations.RunPython(forwards, backwards, elidable=False)]
