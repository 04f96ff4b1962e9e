"""ArtifactReference and CompactionRecord move from the retention app to the store, without
touching the database.

The commit writes a checkpoint's artifact references and ``run_verify`` reads compaction
records, so they are facts of the store. The tables keep their names (``db_table``), columns,
indexes and constraints; only Django's state changes: this migration creates the models in
the store's state and ``retention.0004`` removes them from retention's. It runs after
``retention.0002`` (which created the tables and backfilled the references), so the tables
exist before any later migration of the store alters them.

``CompactionRecord.policy`` was a foreign key to ``retention.RetentionPolicy``; the store
cannot name a retention model, so its state is a plain nullable ``policy_id`` column. The
database keeps the column, its index and its foreign-key constraint as they are.

The ContentType rows of the two models follow them (app label retention -> checkpoints), so
nothing that points at a content type is orphaned and no duplicate is created.
"""

import django.db.models.deletion
from django.db import migrations, models

MOVED = ("artifactreference", "compactionrecord")


def _relabel(apps, schema_editor, *, source, target):
    ContentType = apps.get_model("contenttypes", "ContentType")
    alias = schema_editor.connection.alias
    taken = set(
        ContentType.objects.using(alias)
        .filter(app_label=target, model__in=MOVED)
        .values_list("model", flat=True)
    )
    ContentType.objects.using(alias).filter(app_label=source, model__in=MOVED).exclude(
        model__in=taken
    ).update(app_label=target)
    ContentType.objects.clear_cache()


def forwards(apps, schema_editor):
    _relabel(apps, schema_editor, source="retention", target="checkpoints")


def backwards(apps, schema_editor):
    _relabel(apps, schema_editor, source="checkpoints", target="retention")


class Migration(migrations.Migration):
    dependencies = [
        ("checkpoints", "0007_operation_job_runner_webhook"),
        ("tenants", "0001_initial"),
        ("retention", "0002_backfill_artifact_references"),
        ("contenttypes", "0002_remove_content_type_name"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.CreateModel(
                    name="ArtifactReference",
                    fields=[
                        ("id", models.BigAutoField(primary_key=True, serialize=False)),
                        (
                            "artifact",
                            models.ForeignKey(
                                on_delete=django.db.models.deletion.PROTECT,
                                related_name="+",
                                to="checkpoints.artifact",
                            ),
                        ),
                        (
                            "checkpoint",
                            models.ForeignKey(
                                on_delete=django.db.models.deletion.CASCADE,
                                related_name="+",
                                to="checkpoints.checkpoint",
                            ),
                        ),
                        (
                            "tenant",
                            models.ForeignKey(
                                on_delete=django.db.models.deletion.CASCADE, to="tenants.tenant"
                            ),
                        ),
                    ],
                    options={
                        "db_table": "retention_artifactreference",
                        "indexes": [
                            models.Index(
                                fields=["artifact"], name="retention_a_artifac_4e0186_idx"
                            )
                        ],
                        "constraints": [
                            models.UniqueConstraint(
                                fields=("checkpoint", "artifact"), name="artifact_reference_once"
                            )
                        ],
                    },
                ),
                migrations.CreateModel(
                    name="CompactionRecord",
                    fields=[
                        ("id", models.BigAutoField(primary_key=True, serialize=False)),
                        ("policy_id", models.BigIntegerField(db_index=True, null=True)),
                        ("policy_label", models.CharField(max_length=200)),
                        (
                            "reason",
                            models.CharField(
                                choices=[("intermediate", "Intermediate"), ("expiry", "Expiry")],
                                max_length=16,
                            ),
                        ),
                        ("first_sequence", models.PositiveBigIntegerField()),
                        ("last_sequence", models.PositiveBigIntegerField()),
                        ("removed", models.JSONField()),
                        ("created_at", models.DateTimeField(auto_now_add=True)),
                        (
                            "run",
                            models.ForeignKey(
                                on_delete=django.db.models.deletion.CASCADE,
                                related_name="compactions",
                                to="checkpoints.run",
                            ),
                        ),
                        (
                            "tenant",
                            models.ForeignKey(
                                on_delete=django.db.models.deletion.CASCADE, to="tenants.tenant"
                            ),
                        ),
                    ],
                    options={
                        "db_table": "retention_compactionrecord",
                        "ordering": ["run", "first_sequence"],
                        "indexes": [
                            models.Index(
                                fields=["run", "first_sequence"],
                                name="retention_c_run_id_ed3887_idx",
                            )
                        ],
                    },
                ),
            ],
            database_operations=[],
        ),
        migrations.RunPython(forwards, backwards),
    ]
