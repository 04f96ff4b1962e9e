"""Artifacts in object storage: a real S3-protocol server on loopback (moto's standalone
server, tests/s3_fixtures.py) and the filesystem, through the same settings and code.

Cairn seals artifacts in chunks before they leave the process (checkpoints.artifact_sealing);
the object's name is the sha256 of its sealed bytes.
"""

from __future__ import annotations

import hashlib
import io
import os
import tracemalloc

import pytest
from django.core.files.storage import default_storage

from cairn.errors import IntegrityFailure
from checkpoints import artifact_sealing, crypto
from checkpoints.models import Artifact
from checkpoints.services.artifacts import artifact_content, artifact_reseal, artifact_store

pytestmark = pytest.mark.django_db
MARKER = "plaintext-marker-that-must-not-reach-the-bucket"
MIB = 1024 * 1024


@pytest.fixture(params=["filesystem", "s3"])
def storage(request):  # noqa: ANN001, ANN201
    """Each test once on the filesystem and once on the loopback S3 server."""
    if request.param == "s3":
        return request.getfixturevalue("s3_storage")
    return None


def stored_bytes(name: str) -> bytes:
    with default_storage.open(name, "rb") as handle:
        return handle.read()


def test_the_bucket_holds_only_ciphertext_under_its_content_address(acme, s3_storage):
    data = (MARKER * 5000).encode()  # several chunks
    artifact, created = artifact_store(tenant=acme, data=data, media_type="text/plain")
    assert created
    assert s3_storage.keys() == [artifact.storage_name]
    raw = s3_storage.client().get_object(Bucket=s3_storage.bucket, Key=artifact.storage_name)
    body = raw["Body"].read()
    assert MARKER.encode() not in body
    assert artifact.storage_name == f"artifacts/{acme.id}/{hashlib.sha256(body).hexdigest()}"
    assert artifact_content(artifact) == data


def test_the_same_bytes_again_are_one_object(acme, s3_storage):
    first, _ = artifact_store(tenant=acme, data=b"same", media_type="text/plain")
    again, created = artifact_store(tenant=acme, data=b"same", media_type="text/plain")
    assert (again.pk, created) == (first.pk, False)
    assert s3_storage.keys() == [first.storage_name]


@pytest.mark.parametrize("size", [0, 1, artifact_sealing.CHUNK_BYTES, 3 * 65536 + 17])
def test_it_reads_back_every_size_exactly(acme, storage, size):
    data = os.urandom(size)
    artifact, _ = artifact_store(tenant=acme, data=data, media_type="application/octet-stream")
    assert artifact_content(artifact) == data


def _sealed(data: bytes, scope: dict) -> bytes:
    out = io.BytesIO()
    artifact_sealing.seal_to(data, out, scope=scope)
    return out.getvalue()


SCOPE = {"tenant_id": "t1", "table": "artifact", "row_id": "r1", "field": "content"}


def _unseal(blob: bytes, scope: dict = SCOPE) -> bytes:
    return b"".join(artifact_sealing.unseal_from(io.BytesIO(blob), scope=scope))


def test_a_truncated_object_fails_instead_of_reading_short():
    data = os.urandom(3 * artifact_sealing.CHUNK_BYTES)
    blob = _sealed(data, SCOPE)
    assert _unseal(blob) == data
    chunk = artifact_sealing.CHUNK_BYTES + artifact_sealing.TAG_BYTES
    with pytest.raises(crypto.DecryptionError):
        _unseal(blob[:-chunk])  # whole last chunk gone: the one before is not final
    with pytest.raises(crypto.DecryptionError):
        _unseal(blob[:-1])


def test_reordered_chunks_and_another_rows_object_fail():
    data = os.urandom(2 * artifact_sealing.CHUNK_BYTES + 10)
    blob = _sealed(data, SCOPE)
    chunk = artifact_sealing.CHUNK_BYTES + artifact_sealing.TAG_BYTES
    header = len(blob) - (2 * chunk + 10 + artifact_sealing.TAG_BYTES)
    swapped = blob[:header] + blob[header + chunk : header + 2 * chunk]
    swapped += blob[header : header + chunk] + blob[header + 2 * chunk :]
    with pytest.raises(crypto.DecryptionError):
        _unseal(swapped)
    with pytest.raises(crypto.DecryptionError):
        _unseal(blob, {**SCOPE, "row_id": "r2"})
    with pytest.raises(crypto.DecryptionError):
        _unseal(blob, {**SCOPE, "tenant_id": "t2"})


def test_an_object_written_in_the_old_one_piece_format_still_reads(acme, storage):
    artifact, _ = artifact_store(tenant=acme, data=b"written long ago", media_type="text/plain")
    legacy = crypto.seal(
        b"written long ago",
        tenant_id=acme.id,
        table="artifact",
        row_id=artifact.id,
        field="content",
    )
    default_storage.delete(artifact.storage_name)
    name = default_storage.save(f"artifacts/{acme.id}/{artifact.id}", io.BytesIO(legacy.encode()))
    Artifact.objects.filter(pk=artifact.pk).update(storage_name=name)
    artifact.refresh_from_db()
    assert artifact_content(artifact) == b"written long ago"


def test_a_missing_object_is_an_integrity_failure(acme, storage):
    artifact, _ = artifact_store(tenant=acme, data=b"gone", media_type="text/plain")
    default_storage.delete(artifact.storage_name)
    with pytest.raises(IntegrityFailure, match="cannot be read"):
        artifact_content(artifact)


def test_a_ten_mib_artifact_is_never_held_twice_in_memory(acme, storage):
    # Warm up first: the first S3 call loads botocore's service model, which is not the
    # artifact's memory.
    warm, _ = artifact_store(tenant=acme, data=b"warm up", media_type="text/plain")
    artifact_content(warm)
    data = os.urandom(10 * MIB)
    tracemalloc.start()
    try:
        artifact, _ = artifact_store(tenant=acme, data=data, media_type="application/octet-stream")
        _, store_peak = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        before = tracemalloc.get_traced_memory()[0]
        content = artifact_content(artifact)
        _, read_peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert content == data
    # Storing: the caller's bytes exist already; sealing adds at most a few chunks and the
    # spool's first MiB, never a second copy.
    assert store_peak < 3 * MIB, store_peak
    # Reading: the one buffer that is returned, plus a few chunks.
    assert read_peak - before < 10 * MIB + 3 * MIB, read_peak - before


def test_key_rotation_on_the_bucket_writes_a_new_object_and_drops_the_old(
    acme, s3_storage, settings, django_capture_on_commit_callbacks
):
    artifact, _ = artifact_store(tenant=acme, data=b"rotate me", media_type="text/plain")
    old_name = artifact.storage_name
    settings.CAIRN_ENCRYPTION_KEYS = f"{crypto.new_key_spec('k2')},{settings.CAIRN_ENCRYPTION_KEYS}"
    with django_capture_on_commit_callbacks(execute=True):
        assert artifact_reseal(artifact)
        assert sorted(s3_storage.keys()) == sorted([old_name, artifact.storage_name])
    artifact.refresh_from_db()
    assert artifact.key_id == "k2"
    assert artifact.storage_name != old_name
    assert s3_storage.keys() == [artifact.storage_name]
    assert artifact_content(artifact) == b"rotate me"


def test_the_s3_credentials_are_secret_references_resolved_at_connection(
    s3_storage, monkeypatch, settings
):
    from cairn.secrets import SecretUnavailable

    client = default_storage.connection.meta.client
    assert (
        client._request_signer._credentials.access_key == s3_storage.env["CAIRN_TEST_S3_ACCESS_KEY"]
    )
    # Settings name the secret; they never hold it.
    assert s3_storage.env["CAIRN_TEST_S3_SECRET_KEY"] not in str(settings.STORAGES)
    monkeypatch.delenv("CAIRN_TEST_S3_SECRET_KEY")
    default_storage._connections.connection = None
    with pytest.raises(SecretUnavailable, match="CAIRN_TEST_S3_SECRET_KEY is not set"):
        default_storage.connection  # noqa: B018 - connecting is what resolves the reference


@pytest.mark.parametrize(
    ("variables", "message"),
    [
        ({"CAIRN_ARTIFACT_STORAGE": "ftp"}, "use filesystem or s3"),
        ({"CAIRN_ARTIFACT_STORAGE": "s3"}, "needs CAIRN_S3_BUCKET"),
    ],
)
def test_a_wrong_storage_setting_is_refused_at_startup_with_a_sentence(
    tmp_path, variables, message
):
    import subprocess
    import sys

    from tests.scaleout_support import REPO

    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "cairn.settings", **variables}
    env["CAIRN_HOME"] = str(tmp_path)
    env.pop("CAIRN_S3_BUCKET", None)
    done = subprocess.run(
        [sys.executable, "manage.py", "check"], cwd=REPO, env=env, capture_output=True, text=True
    )
    assert done.returncode != 0
    assert message in done.stderr
