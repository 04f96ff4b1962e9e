"""Artifacts are content-addressed and encrypted; payload columns never hold plaintext."""

from __future__ import annotations

import pytest
from django.core.files.storage import default_storage
from django.core.management import call_command
from django.db import connection

from cairn.errors import IntegrityFailure
from checkpoints import crypto
from checkpoints.crypto import new_key_spec
from checkpoints.models import Artifact, Checkpoint
from checkpoints.services.artifacts import artifact_content, artifact_store
from checkpoints.services.checkpoints import CommitRequest, checkpoint_commit
from checkpoints.services.reads import checkpoint_envelope
from tenants.services import Actor

pytestmark = pytest.mark.django_db
MARKER = "PLAINTEXT-MARKER-7f3a"


@pytest.fixture
def api(api_as, bob, acme, workflow):  # noqa: ANN001
    return api_as(bob, acme)


def upload(api, data: bytes, media_type: str = "text/plain", kind: str | None = None):  # noqa: ANN001, ANN201
    headers = {"HTTP_X_ARTIFACT_KIND": kind} if kind else {}
    return api.generic("POST", "/api/v1/artifacts", data, content_type=media_type, **headers)


def test_the_same_bytes_are_stored_once_per_tenant(api):
    first = upload(api, b"hello draft", kind="draft")
    assert first.status_code == 201
    body = first.json()
    assert (body["size"], body["media_type"], body["kind"]) == (11, "text/plain", "draft")
    again = upload(api, b"hello draft", kind="draft")
    assert again.status_code == 200 and again.json()["id"] == body["id"]
    assert api.get(f"/api/v1/artifacts/{body['id']}").json()["sha256"] == body["sha256"]
    content = api.get(f"/api/v1/artifacts/{body['id']}/content")
    assert content.status_code == 200 and content.content == b"hello draft"


def test_the_sha256_is_of_the_plain_bytes(api):
    import hashlib

    body = upload(api, b"abc").json()
    assert body["sha256"] == hashlib.sha256(b"abc").hexdigest()


def test_it_refuses_an_unknown_kind_and_an_oversized_artifact(api, settings):
    bad = upload(api, b"x", kind="poem")
    assert (bad.status_code, bad.json()["code"]) == (400, "invalid_request")
    settings.CAIRN_MAX_ARTIFACT_BYTES = 10
    big = upload(api, b"x" * 11)
    assert (big.status_code, big.json()["code"]) == (413, "payload_too_large")
    assert Artifact.objects.count() == 0


def test_the_stored_file_does_not_contain_the_plaintext(acme):
    artifact, _ = artifact_store(tenant=acme, data=MARKER.encode(), media_type="text/plain")
    with default_storage.open(artifact.storage_name, "rb") as handle:
        stored = handle.read()
    assert MARKER.encode() not in stored
    assert artifact_content(artifact) == MARKER.encode()


def test_the_envelope_column_does_not_contain_the_plaintext(run, bob):
    checkpoint_commit(
        tenant=run.tenant,
        run_id=run.id,
        request=CommitRequest(
            expected_version=1,
            state="draft_answer",
            envelope={"inputs": {"note": MARKER}},
            actor=Actor(user=bob),
        ),
    )
    with connection.cursor() as cursor:
        cursor.execute("SELECT envelope_sealed FROM checkpoints_checkpoint")
        columns = [row[0] for row in cursor.fetchall()]
    assert len(columns) == 2
    assert all(MARKER not in column for column in columns)
    latest = Checkpoint.objects.get(run=run, sequence=2)
    assert checkpoint_envelope(latest)["inputs"]["note"] == MARKER


def test_a_ciphertext_moved_to_another_row_fails_to_decrypt(run, bob, globex):
    checkpoint_commit(
        tenant=run.tenant,
        run_id=run.id,
        request=CommitRequest(
            expected_version=1,
            state="draft_answer",
            envelope={"inputs": {"note": MARKER}},
            actor=Actor(user=bob),
        ),
    )
    first, second = Checkpoint.objects.filter(run=run).order_by("sequence")
    # Copy the second row's ciphertext into the first row (as a database intruder would).
    first.envelope_sealed = second.envelope_sealed
    with pytest.raises(IntegrityFailure):
        checkpoint_envelope(first)
    # The same ciphertext claimed by another tenant fails too.
    second.tenant_id = globex.id
    with pytest.raises(IntegrityFailure):
        checkpoint_envelope(second)


def test_an_artifact_file_swapped_with_another_fails_its_check(acme):
    one, _ = artifact_store(tenant=acme, data=b"one", media_type="text/plain")
    two, _ = artifact_store(tenant=acme, data=b"two", media_type="text/plain")
    with default_storage.open(two.storage_name, "rb") as handle:
        sealed_two = handle.read()
    with default_storage.open(one.storage_name, "wb") as handle:
        handle.write(sealed_two)
    with pytest.raises(IntegrityFailure):
        artifact_content(one)


def test_a_missing_key_is_named_in_the_error(acme, settings):
    artifact, _ = artifact_store(tenant=acme, data=b"under k-old", media_type="text/plain")
    old_id = crypto.keyring().active_id
    settings.CAIRN_ENCRYPTION_KEYS = new_key_spec("k-other")
    with pytest.raises(crypto.MissingKeyError) as caught:
        artifact_content(artifact)
    assert old_id in str(caught.value)


def test_a_missing_key_is_a_clear_api_error_not_a_500(api, acme, settings):
    body = upload(api, b"readable only with the old key").json()
    settings.CAIRN_ENCRYPTION_KEYS = new_key_spec("k-new")
    response = api.get(f"/api/v1/artifacts/{body['id']}/content")
    assert response.status_code == 503
    assert response.json()["code"] == "key_unavailable"
    assert "'test1'" in response.json()["detail"]


def test_rotation_reencrypts_everything_and_keeps_it_readable(run, bob, acme, settings, capsys):
    artifact, _ = artifact_store(tenant=acme, data=MARKER.encode(), media_type="text/plain")
    checkpoint_commit(
        tenant=run.tenant,
        run_id=run.id,
        request=CommitRequest(
            expected_version=1,
            state="draft_answer",
            envelope={
                "evidence": {
                    "artifacts": [{"id": str(artifact.id), "sha256": artifact.sha256}],
                    "validators": [],
                }
            },
            actor=Actor(user=bob),
        ),
    )
    old_spec = settings.CAIRN_ENCRYPTION_KEYS
    new_spec = new_key_spec("k2")
    before = {c.pk: checkpoint_envelope(c) for c in Checkpoint.objects.all()}
    settings.CAIRN_ENCRYPTION_KEYS = f"{new_spec},{old_spec}"
    call_command("rotate_keys", "--batch-size", "1")
    assert "Rotation complete: checkpoints 2, artifacts 1" in capsys.readouterr().out
    assert set(Checkpoint.objects.values_list("key_id", flat=True)) == {"k2"}
    assert set(Artifact.objects.values_list("key_id", flat=True)) == {"k2"}
    # The old key can now go: everything is readable under the new key alone.
    settings.CAIRN_ENCRYPTION_KEYS = new_spec
    for checkpoint in Checkpoint.objects.all():
        assert checkpoint_envelope(checkpoint) == before[checkpoint.pk]
        assert checkpoint.sha256 == Checkpoint.objects.get(pk=checkpoint.pk).sha256
    assert artifact_content(Artifact.objects.get(pk=artifact.pk)) == MARKER.encode()
    # Running it again finds nothing left to do.
    call_command("rotate_keys")
    assert "checkpoints 0, artifacts 0" in capsys.readouterr().out
