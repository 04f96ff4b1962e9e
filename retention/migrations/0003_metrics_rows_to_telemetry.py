"""The metrics rows now belong to the telemetry app (``telemetry.0001``): remove them from
retention's state only. The tables stay, with their rows; telemetry's models use them."""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("retention", "0002_backfill_artifact_references"),
        ("telemetry", "0001_initial"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.DeleteModel(name="CommitLatencySample"),
                migrations.DeleteModel(name="MetricIncrement"),
                migrations.DeleteModel(name="MetricTotal"),
            ],
            database_operations=[],
        ),
    ]
