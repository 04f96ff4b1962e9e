"""verify re-checks the hash chain and artifact hashes; tampering is reported, not hidden."""

from __future__ import annotations

import pytest
from django.core.files.base import ContentFile
from django.core.files.storage import default_storage
from django.db import connection, transaction

from checkpoints import crypto
from checkpoints.models import Checkpoint
from checkpoints.services.artifacts import artifact_store
from checkpoints.services.checkpoints import CommitRequest, checkpoint_commit, envelope_seal
from checkpoints.services.integrity import run_verify
from checkpoints.services.reads import checkpoint_envelope
from tenants.services import Actor

pytestmark = pytest.mark.django_db


@pytest.fixture
def history(run, bob, acme):  # noqa: ANN001
    artifact, _ = artifact_store(tenant=acme, data=b"the draft", media_type="text/plain")
    evidence = {
        "artifacts": [{"id": str(artifact.id), "sha256": artifact.sha256}],
        "validators": [],
    }
    for version, state in enumerate(["draft_answer", "review"], start=1):
        checkpoint_commit(
            tenant=acme,
            run_id=run.id,
            request=CommitRequest(
                expected_version=version,
                state=state,
                envelope={"evidence": evidence},
                actor=Actor(user=bob),
            ),
        )
    return run, artifact


def write_sealed(checkpoint: Checkpoint, sealed: str) -> None:
    """Overwrite a checkpoint's ciphertext behind the ORM's back, as an intruder would."""
    with transaction.atomic(), connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("SET LOCAL cairn.rotation = 'on'")
        table = Checkpoint._meta.db_table
        pk = checkpoint.pk.hex if connection.vendor == "sqlite" else checkpoint.pk
        cursor.execute(f"UPDATE {table} SET envelope_sealed = %s WHERE id = %s", [sealed, pk])


def test_an_untouched_history_verifies(history, acme):
    run, _ = history
    assert run_verify(tenant=acme, run_id=run.id) == {"ok": True, "checkpoints": 3, "problems": []}


def test_an_envelope_rewritten_with_a_valid_key_is_reported(history, acme):
    run, _ = history
    target = Checkpoint.objects.get(run=run, sequence=2)
    envelope = checkpoint_envelope(target)
    envelope["inputs"]["values"]["question"] = "something else"
    write_sealed(
        target, envelope_seal(tenant_id=acme.id, checkpoint_id=target.id, envelope=envelope)
    )
    result = run_verify(tenant=acme, run_id=run.id)
    assert result["ok"] is False
    assert any("checkpoint 2" in p and "tampered" in p for p in result["problems"])


def test_damaged_ciphertext_is_reported(history, acme):
    run, _ = history
    target = Checkpoint.objects.get(run=run, sequence=3)
    sealed = target.envelope_sealed
    write_sealed(target, sealed[:-8] + ("A" * 8 if not sealed.endswith("A" * 8) else "B" * 8))
    problems = run_verify(tenant=acme, run_id=run.id)["problems"]
    assert any(p.startswith("checkpoint 3") for p in problems)


def test_a_tampered_artifact_is_reported(history, acme):
    run, artifact = history
    forged = crypto.seal(
        b"another draft", tenant_id=acme.id, table="artifact", row_id=artifact.id, field="content"
    )
    default_storage.delete(artifact.storage_name)
    default_storage.save(artifact.storage_name, ContentFile(forged.encode()))
    result = run_verify(tenant=acme, run_id=run.id)
    assert result["ok"] is False
    assert any("does not match its sha256" in p for p in result["problems"])


def test_verify_is_served_over_the_api(history, api_as, bob, acme):
    run, artifact = history
    default_storage.delete(artifact.storage_name)
    body = api_as(bob, acme).get(f"/api/v1/runs/{run.id}/verify").json()
    assert body["ok"] is False and body["problems"]
