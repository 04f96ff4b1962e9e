"""On PostgreSQL the database itself refuses to update or delete a checkpoint.

Two narrow exceptions, each switched on for one transaction with SET LOCAL:
``cairn.retention = 'on'`` lets the retention job delete, and ``cairn.rotation = 'on'`` lets
key rotation rewrite the ciphertext columns (and nothing else) of a row.
"""

from django.db import migrations

CREATE = """
CREATE OR REPLACE FUNCTION cairn_checkpoint_immutable() RETURNS trigger AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        IF coalesce(current_setting('cairn.retention', true), '') = 'on' THEN
            RETURN OLD;
        END IF;
        RAISE EXCEPTION 'checkpoints are deleted only by retention' USING ERRCODE = 'check_violation';
    END IF;
    IF coalesce(current_setting('cairn.rotation', true), '') = 'on'
       AND (to_jsonb(NEW) - 'envelope_sealed' - 'key_id') = (to_jsonb(OLD) - 'envelope_sealed' - 'key_id') THEN
        RETURN NEW;
    END IF;
    RAISE EXCEPTION 'checkpoints are immutable: they are never updated' USING ERRCODE = 'check_violation';
END;
$$ LANGUAGE plpgsql;

CREATE TRIGGER checkpoint_immutable
    BEFORE UPDATE OR DELETE ON checkpoints_checkpoint
    FOR EACH ROW EXECUTE FUNCTION cairn_checkpoint_immutable();
"""

DROP = """
DROP TRIGGER IF EXISTS checkpoint_immutable ON checkpoints_checkpoint;
DROP FUNCTION IF EXISTS cairn_checkpoint_immutable();
"""


def forwards(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(CREATE)


def backwards(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(DROP)


class Migration(migrations.Migration):
    dependencies = [("checkpoints", "0002_initial")]

    operations = [migrations.RunPython(forwards, backwards)]
