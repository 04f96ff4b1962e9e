"""ArtifactReference and CompactionRecord now belong to the store (``checkpoints.0008``):
remove them from retention's state only. The tables stay, with their rows, and so does the
foreign key from ``retention_compactionrecord.policy_id`` to the policies."""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("retention", "0003_metrics_rows_to_telemetry"),
        ("checkpoints", "0008_artifact_references_and_compactions_from_retention"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.DeleteModel(name="ArtifactReference"),
                migrations.DeleteModel(name="CompactionRecord"),
            ],
            database_operations=[],
        ),
    ]
