"""Shared GPUs: fractions of one GPU for several bookings at once (docs/scheduling.md).

A GPU gets a sharing mode (exclusive, the default, or shared); a booking may ask for a fraction
(a compute share, the memory it needs, or both); an allocation records the share and memory it
holds. The exclusion constraint of 0004 refused any two live allocations on one GPU whose slots
and periods overlap: every fraction holds all of its GPU, so fractions could never share. Now a
fraction's range is a point of its own, past the seven compute slices ([id + 8, id + 9)), and a
whole GPU's range runs from slice 0 to infinity: two fractions never clash, a whole GPU still
clashes with any other allocation on it (fractions included) and MIG slices with each other as
before. That the shares of a GPU sum to at most 1 and its memory is not oversubscribed is checked
under the start lock (portal/services/inventory/sharing.py). PostgreSQL only, like 0004.
"""

from django.db import migrations, models

CONSTRAINT = "portal_allocation_no_overlap"
NEW_CONSTRAINT = f"""
ALTER TABLE portal_allocation ADD CONSTRAINT {CONSTRAINT}
EXCLUDE USING gist (
    gpu_id WITH =,
    (CASE
        WHEN share < 1 THEN int8range(id + 8, id + 9)
        WHEN mig_instance_id IS NULL THEN int8range(0, NULL)
        ELSE int8range(slot_start, slot_end)
    END) WITH &&,
    tstzrange(start, "end", '[)') WITH &&
) WHERE (live)
"""
OLD_CONSTRAINT = f"""
ALTER TABLE portal_allocation ADD CONSTRAINT {CONSTRAINT}
EXCLUDE USING gist (
    gpu_id WITH =,
    int4range(slot_start, slot_end) WITH &&,
    tstzrange(start, "end", '[)') WITH &&
) WHERE (live)
"""
DROP_CONSTRAINT = f"ALTER TABLE portal_allocation DROP CONSTRAINT IF EXISTS {CONSTRAINT}"


def _on_postgres(statements):
    def run(apps, schema_editor):
        if schema_editor.connection.vendor == "postgresql":
            for sql in statements:
                schema_editor.execute(sql, params=None)

    return run


class Migration(migrations.Migration):
    dependencies = [("portal", "0030_maintenance_windows")]

    operations = [
        migrations.AddField(
            model_name="gpu",
            name="sharing",
            field=models.CharField(
                choices=[("exclusive", "Exclusive"), ("shared", "Shared")],
                default="exclusive",
                help_text="Exclusive: whole (or MIG slices) to one booking; shared: fractions "
                "to several.",
                max_length=9,
            ),
        ),
        migrations.AddField(
            model_name="booking",
            name="gpu_fraction",
            field=models.FloatField(
                blank=True, help_text="Share of one shared GPU's compute, 0 < f < 1.", null=True
            ),
        ),
        migrations.AddField(
            model_name="booking",
            name="gpu_memory_mib",
            field=models.PositiveIntegerField(
                blank=True, help_text="GPU memory it needs on one shared GPU, in MiB.", null=True
            ),
        ),
        migrations.AddField(
            model_name="allocation",
            name="share",
            field=models.FloatField(
                default=1.0, help_text="Compute share of its GPU: 1, or 0 < s < 1."
            ),
        ),
        migrations.AddField(
            model_name="allocation",
            name="gpu_memory_mib",
            field=models.PositiveIntegerField(
                blank=True,
                help_text="GPU memory a share holds, in MiB (empty: whole device).",
                null=True,
            ),
        ),
        migrations.AlterField(
            model_name="allocation",
            name="fraction",
            field=models.FloatField(
                help_text="GPU-equivalents of the device: 1, slices/7, or the share of a shared "
                "GPU."
            ),
        ),
        migrations.AddConstraint(
            model_name="gpu",
            constraint=models.CheckConstraint(
                condition=models.Q(sharing__in=["exclusive", "shared"]),
                name="portal_gpu_sharing_known",
            ),
        ),
        migrations.AddConstraint(
            model_name="gpu",
            constraint=models.CheckConstraint(
                condition=models.Q(sharing="exclusive") | models.Q(mig_mode=False),
                name="portal_gpu_shared_not_mig",
            ),
        ),
        migrations.AddConstraint(
            model_name="booking",
            constraint=models.CheckConstraint(
                condition=models.Q(gpu_fraction__isnull=True)
                | models.Q(gpu_fraction__gt=0, gpu_fraction__lt=1),
                name="portal_booking_fraction_in_range",
            ),
        ),
        migrations.AddConstraint(
            model_name="booking",
            constraint=models.CheckConstraint(
                condition=models.Q(gpu_fraction__isnull=True, gpu_memory_mib__isnull=True)
                | models.Q(gpus=1, mig_profile="") & ~models.Q(gpu_memory_mib=0),
                name="portal_booking_fraction_of_one_gpu",
            ),
        ),
        migrations.AddConstraint(
            model_name="allocation",
            constraint=models.CheckConstraint(
                condition=models.Q(share__gt=0, share__lte=1),
                name="portal_allocation_share_range",
            ),
        ),
        migrations.RunPython(
            _on_postgres([DROP_CONSTRAINT, NEW_CONSTRAINT]),
            _on_postgres([DROP_CONSTRAINT, OLD_CONSTRAINT]),
        ),
    ]
