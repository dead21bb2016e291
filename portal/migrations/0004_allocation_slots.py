"""No overlap between a whole GPU and its MIG slices, nor between a slice and a changed layout.

Migration 0002 keyed the exclusion constraint on (gpu, MIG instance or 0), so a whole-GPU
allocation and a MIG allocation on the same GPU, or two MIG instances of different layouts that
share compute slices, did not conflict. Now every allocation records the compute slices it
occupies on its GPU, [slot_start, slot_end): 0..7 for a whole GPU, the MIG instance's placement
otherwise. A trigger fills them from the database's own rows on every insert or device change, so
no writer can get them wrong, and the constraint refuses two live allocations on one GPU whose
slots and periods both overlap. Existing MIG instances are placed in id order (their registration
order) and existing allocations backfilled; the new constraint fails loudly if the data already
held such an overlap. PostgreSQL only, like 0002: SQLite has no exclusion constraints.
"""

import django.db.models.expressions
from django.db import migrations, models

CONSTRAINT = "portal_allocation_no_overlap"
WHOLE_GPU_SLICES = 7

SLOTS_FUNCTION = f"""
CREATE OR REPLACE FUNCTION portal_allocation_slots() RETURNS trigger AS $$
DECLARE
    mig_gpu integer;
BEGIN
    IF NEW.mig_instance_id IS NULL THEN
        NEW.slot_start := 0;
        NEW.slot_end := {WHOLE_GPU_SLICES};
    ELSE
        SELECT gpu_id, placement_start, placement_start + slices
          INTO mig_gpu, NEW.slot_start, NEW.slot_end
          FROM portal_miginstance WHERE id = NEW.mig_instance_id;
        IF mig_gpu IS DISTINCT FROM NEW.gpu_id THEN
            RAISE EXCEPTION 'MIG instance % is not on GPU %', NEW.mig_instance_id, NEW.gpu_id
                USING ERRCODE = 'check_violation', CONSTRAINT = 'portal_allocation_mig_on_gpu';
        END IF;
    END IF;
    RETURN NEW;
END
$$ LANGUAGE plpgsql
"""
TRIGGER = """
CREATE TRIGGER portal_allocation_slots
BEFORE INSERT OR UPDATE OF gpu_id, mig_instance_id, slot_start, slot_end ON portal_allocation
FOR EACH ROW EXECUTE FUNCTION portal_allocation_slots()
"""
BACKFILL = "UPDATE portal_allocation SET mig_instance_id = mig_instance_id"
NEW_CONSTRAINT = f"""
ALTER TABLE portal_allocation ADD CONSTRAINT {CONSTRAINT}
EXCLUDE USING gist (
    gpu_id WITH =,
    int4range(slot_start, slot_end) WITH &&,
    tstzrange(start, "end", '[)') WITH &&
) WHERE (live)
"""
OLD_CONSTRAINT = f"""
ALTER TABLE portal_allocation ADD CONSTRAINT {CONSTRAINT}
EXCLUDE USING gist (
    gpu_id WITH =,
    (COALESCE(mig_instance_id, 0)) WITH =,
    tstzrange(start, "end", '[)') WITH &&
) WHERE (live)
"""
DROP_CONSTRAINT = f"ALTER TABLE portal_allocation DROP CONSTRAINT IF EXISTS {CONSTRAINT}"
FORWARD = [
    SLOTS_FUNCTION,
    TRIGGER,
    BACKFILL,
    DROP_CONSTRAINT,
    NEW_CONSTRAINT,
]
BACKWARD = [
    DROP_CONSTRAINT,
    OLD_CONSTRAINT,
    "DROP TRIGGER IF EXISTS portal_allocation_slots ON portal_allocation",
    "DROP FUNCTION IF EXISTS portal_allocation_slots()",
]


def place_existing_instances(apps, schema_editor):
    """Pack each GPU's MIG instances in registration (id) order, as the register does now."""
    MigInstance = apps.get_model("portal", "MigInstance")
    offsets: dict[int, int] = {}
    for mig in MigInstance.objects.order_by("gpu_id", "id"):
        start = offsets.get(mig.gpu_id, 0)
        mig.placement_start = min(start, WHOLE_GPU_SLICES - mig.slices)
        offsets[mig.gpu_id] = start + mig.slices
        mig.save(update_fields=["placement_start"])


def _on_postgres(statements):
    def run(apps, schema_editor):
        if schema_editor.connection.vendor == "postgresql":
            for sql in statements:
                schema_editor.execute(sql, params=None)  # the function body has % signs

    return run


class Migration(migrations.Migration):
    dependencies = [("portal", "0003_telemetry")]

    operations = [
        migrations.AddField(
            model_name="miginstance",
            name="placement_start",
            field=models.PositiveSmallIntegerField(
                default=0,
                help_text="First compute slice (0-6) the instance occupies on its GPU; it holds "
                "[placement_start, placement_start + slices).",
            ),
        ),
        migrations.RunPython(place_existing_instances, migrations.RunPython.noop),
        migrations.AddConstraint(
            model_name="miginstance",
            constraint=models.CheckConstraint(
                condition=models.Q(
                    (
                        "placement_start__lte",
                        django.db.models.expressions.CombinedExpression(
                            models.Value(7), "-", models.F("slices")
                        ),
                    )
                ),
                name="portal_miginstance_placement_fits",
            ),
        ),
        migrations.AddField(
            model_name="allocation",
            name="slot_start",
            field=models.PositiveSmallIntegerField(editable=False, null=True),
        ),
        migrations.AddField(
            model_name="allocation",
            name="slot_end",
            field=models.PositiveSmallIntegerField(editable=False, null=True),
        ),
        migrations.RunPython(_on_postgres(FORWARD), _on_postgres(BACKWARD)),
    ]
