"""The metrics rows move from the retention app to telemetry, without touching the database.

The tables keep their names (``db_table``), their columns, indexes and constraints; only
Django's state changes: this migration creates the models in telemetry's state and
``retention.0003`` removes them from retention's. It runs after ``retention.0002``, so the
tables exist (on a fresh database ``retention.0001`` creates them) before any later telemetry
migration alters them.

The ContentType rows of the three models follow them (app label retention -> telemetry), so
nothing that points at a content type (permissions, admin log entries) is orphaned and no
duplicate is created after the migration.
"""

from django.db import migrations, models

MOVED = ("metricincrement", "commitlatencysample", "metrictotal")


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
    _relabel(apps, schema_editor, source="retention", target="telemetry")


def backwards(apps, schema_editor):
    _relabel(apps, schema_editor, source="telemetry", target="retention")


class Migration(migrations.Migration):
    initial = True

    dependencies = [
        ("retention", "0002_backfill_artifact_references"),
        ("contenttypes", "0002_remove_content_type_name"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.CreateModel(
                    name="MetricIncrement",
                    fields=[
                        ("id", models.BigAutoField(primary_key=True, serialize=False)),
                        ("name", models.CharField(max_length=100)),
                        ("labels", models.CharField(blank=True, max_length=200)),
                        ("value", models.FloatField()),
                        ("created_at", models.DateTimeField(auto_now_add=True)),
                    ],
                    options={"db_table": "retention_metricincrement"},
                ),
                migrations.CreateModel(
                    name="CommitLatencySample",
                    fields=[
                        ("id", models.BigAutoField(primary_key=True, serialize=False)),
                        ("seconds", models.FloatField()),
                        ("created_at", models.DateTimeField(auto_now_add=True)),
                    ],
                    options={
                        "db_table": "retention_commitlatencysample",
                        "indexes": [
                            models.Index(fields=["created_at"], name="latency_created_idx")
                        ],
                        "constraints": [
                            models.CheckConstraint(
                                condition=models.Q(("seconds__gte", 0)), name="latency_positive"
                            )
                        ],
                    },
                ),
                migrations.CreateModel(
                    name="MetricTotal",
                    fields=[
                        (
                            "id",
                            models.BigAutoField(
                                auto_created=True,
                                primary_key=True,
                                serialize=False,
                                verbose_name="ID",
                            ),
                        ),
                        ("name", models.CharField(max_length=100)),
                        ("labels", models.CharField(blank=True, max_length=200)),
                        ("value", models.FloatField(default=0)),
                    ],
                    options={
                        "db_table": "retention_metrictotal",
                        "constraints": [
                            models.UniqueConstraint(
                                fields=("name", "labels"), name="metric_total_once"
                            )
                        ],
                    },
                ),
            ],
            database_operations=[],
        ),
        migrations.RunPython(forwards, backwards),
    ]
