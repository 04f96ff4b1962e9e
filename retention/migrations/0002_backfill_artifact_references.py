"""Index the artifact references of checkpoints written before the index existed.

Decrypts each existing envelope once (in chunks). A store with no checkpoints yet does
nothing. A checkpoint that cannot be decrypted stops the migration: retention must never
run with a reference it does not know about.
"""

import json

from django.db import migrations


def backfill(apps, schema_editor):
    from checkpoints import crypto

    Checkpoint = apps.get_model("checkpoints", "Checkpoint")
    Artifact = apps.get_model("checkpoints", "Artifact")
    ArtifactReference = apps.get_model("retention", "ArtifactReference")
    batch = []
    rows = Checkpoint.objects.values_list("id", "tenant_id", "envelope_sealed").iterator(
        chunk_size=500
    )
    for checkpoint_id, tenant_id, sealed in rows:
        plain = crypto.unseal(
            sealed, tenant_id=tenant_id, table="checkpoint", row_id=checkpoint_id, field="envelope"
        )
        refs = (json.loads(plain).get("evidence") or {}).get("artifacts") or []
        ids = {str(ref["id"]) for ref in refs if ref.get("id")}
        existing = set(map(str, Artifact.objects.filter(pk__in=ids).values_list("pk", flat=True)))
        batch.extend(
            ArtifactReference(tenant_id=tenant_id, checkpoint_id=checkpoint_id, artifact_id=pk)
            for pk in sorted(ids & existing)
        )
        if len(batch) >= 1000:
            ArtifactReference.objects.bulk_create(batch, ignore_conflicts=True)
            batch = []
    ArtifactReference.objects.bulk_create(batch, ignore_conflicts=True)


class Migration(migrations.Migration):
    dependencies = [("retention", "0001_initial")]

    operations = [migrations.RunPython(backfill, migrations.RunPython.noop)]
