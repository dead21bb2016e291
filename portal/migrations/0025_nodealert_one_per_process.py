"""One NodeAlert per process: repeats count on one row (count, last_seen) instead of a row each.

The rows written before are merged first (the earliest kept, counting the rest), so the
uniqueness can be added over them.
"""

import django.db.models.functions.comparison
from django.db import migrations, models
from django.db.models import Count, F, Max, Min, Value
from django.db.models.functions import Coalesce

KEY = ("node_id", "kind", "device_uuid", "booking_key", "pid_key", "user")


def merge_repeats(apps, schema_editor):
    NodeAlert = apps.get_model("portal", "NodeAlert")
    NodeAlert.objects.update(last_seen=F("time"))
    NodeAlert.objects.filter(booking__isnull=False).update(booking_key=F("booking_id"))
    groups = (
        NodeAlert.objects.annotate(pid_key=Coalesce("pid", Value(-1)))
        .values(*KEY)
        .annotate(rows=Count("id"), keep=Min("id"), first=Min("time"), last=Max("time"))
        .filter(rows__gt=1)
    )
    for group in groups.iterator():
        same = NodeAlert.objects.annotate(pid_key=Coalesce("pid", Value(-1))).filter(
            **{name: group[name] for name in KEY}
        )
        same.exclude(pk=group["keep"]).delete()
        NodeAlert.objects.filter(pk=group["keep"]).update(
            count=group["rows"], time=group["first"], last_seen=group["last"]
        )
    if schema_editor.connection.vendor == "postgresql":
        # Run the foreign-key checks these writes queued now: the table is altered next.
        schema_editor.execute("SET CONSTRAINTS ALL IMMEDIATE")
        schema_editor.execute("SET CONSTRAINTS ALL DEFERRED")


class Migration(migrations.Migration):
    dependencies = [
        ("portal", "0024_gpu_topology_node_network_group"),
    ]

    operations = [
        migrations.AddField(
            model_name="nodealert",
            name="count",
            field=models.PositiveIntegerField(
                default=1, help_text="How often the agent reported it."
            ),
        ),
        migrations.AddField(
            model_name="nodealert",
            name="booking_key",
            field=models.BigIntegerField(default=0),
        ),
        migrations.AddField(
            model_name="nodealert",
            name="last_seen",
            field=models.DateTimeField(null=True, help_text="When the agent last reported it."),
        ),
        migrations.AlterField(
            model_name="nodealert",
            name="time",
            field=models.DateTimeField(help_text="When the agent first saw it."),
        ),
        migrations.RunPython(merge_repeats, migrations.RunPython.noop, elidable=True),
        migrations.AlterField(
            model_name="nodealert",
            name="last_seen",
            field=models.DateTimeField(help_text="When the agent last reported it."),
        ),
        migrations.AddConstraint(
            model_name="nodealert",
            constraint=models.UniqueConstraint(
                models.F("node"),
                models.F("kind"),
                models.F("device_uuid"),
                models.F("booking_key"),
                django.db.models.functions.comparison.Coalesce(
                    models.F("pid"), models.Value(-1)
                ),
                models.F("user"),
                name="portal_nodealert_one_per_process",
            ),
        ),
        migrations.AddIndex(
            model_name="nodealert",
            index=models.Index(fields=["last_seen"], name="portal_nodealert_last_seen"),
        ),
    ]
