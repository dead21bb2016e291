from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("portal", "0029_borrowing"),
    ]

    operations = [
        migrations.AddField(
            model_name="node",
            name="cpus",
            field=models.PositiveIntegerField(
                blank=True, help_text="CPU cores jobs may use, as its agent reports.", null=True
            ),
        ),
        migrations.AddField(
            model_name="node",
            name="memory_mib",
            field=models.PositiveIntegerField(
                blank=True,
                help_text="Host memory (MiB) jobs may use, as its agent reports.",
                null=True,
            ),
        ),
    ]
