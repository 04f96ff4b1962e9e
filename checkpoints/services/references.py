"""The checkpoint → artifact reference index, written in the commit transaction.

Envelopes are encrypted, so retention cannot ask the database which artifacts a kept
checkpoint names. ``references_record`` is called by ``checkpoint_insert`` and writes one
``ArtifactReference`` per artifact in ``evidence.artifacts``. On PostgreSQL it first takes
``FOR KEY SHARE`` on the artifact rows: a retention job that deleted one of them a moment
earlier makes this commit fail cleanly (ArtifactHashMismatch) instead of committing a
reference to a row that is gone, and a retention job that comes later skips the locked row.
"""

from __future__ import annotations

from typing import Any

from django.db import connection

from cairn.errors import ArtifactHashMismatch
from checkpoints.models import Artifact, ArtifactReference, Checkpoint


def artifact_ids_of(envelope: dict[str, Any], attempt: dict[str, Any] | None = None) -> list[str]:
    """The artifacts a checkpoint names: its envelope's evidence, and the step attempt it
    records (its traceback, its model calls' prompts and responses)."""
    refs = list((envelope.get("evidence") or {}).get("artifacts") or [])
    if attempt:
        refs.append(attempt.get("traceback") or {})
        for call in attempt.get("model_calls") or []:
            refs += [call.get("prompt") or {}, call.get("response") or {}]
    return sorted({str(ref["id"]) for ref in refs if ref.get("id")})


def _lock_artifacts(ids: list[str]) -> set[str]:
    if connection.vendor != "postgresql":
        # SQLite writers hold the database lock for the whole transaction: nothing races.
        return {str(pk) for pk in Artifact.objects.filter(pk__in=ids).values_list("pk", flat=True)}
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT id FROM {Artifact._meta.db_table} WHERE id = ANY(%s::uuid[]) FOR KEY SHARE",
            [ids],
        )
        return {str(row[0]) for row in cursor.fetchall()}


def references_record(
    *, checkpoint: Checkpoint, envelope: dict[str, Any], attempt: dict[str, Any] | None = None
) -> int:
    """Index the artifacts this checkpoint names (``artifact_ids_of``). Call inside the
    commit transaction. Raises ArtifactHashMismatch when one of them no longer exists."""
    ids = artifact_ids_of(envelope, attempt)
    if not ids:
        return 0
    present = _lock_artifacts(ids)
    missing = [pk for pk in ids if pk not in present]
    if missing:
        raise ArtifactHashMismatch(f"Artifact {missing[0]} does not exist in this tenant.")
    ArtifactReference.objects.bulk_create(
        [
            ArtifactReference(tenant_id=checkpoint.tenant_id, checkpoint=checkpoint, artifact_id=pk)
            for pk in ids
        ]
    )
    return len(ids)
