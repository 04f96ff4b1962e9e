"""On PostgreSQL, a trigram index makes the console's objective search (ILIKE '%text%')
an index scan instead of a scan of every run of the tenant. SQLite has no equivalent."""

from django.db import migrations

CREATE = """
CREATE EXTENSION IF NOT EXISTS pg_trgm;
CREATE INDEX IF NOT EXISTS run_objective_trgm_idx
    ON checkpoints_run USING gin (objective_ref gin_trgm_ops);
"""
DROP = "DROP INDEX IF EXISTS run_objective_trgm_idx;"


def forwards(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(CREATE)


def backwards(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(DROP)


class Migration(migrations.Migration):
    dependencies = [("checkpoints", "0005_run_console_indexes")]

    operations = [migrations.RunPython(forwards, backwards)]
