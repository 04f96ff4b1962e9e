"""Artifacts: content-addressed, encrypted at rest, deduplicated per tenant."""

from __future__ import annotations

import hashlib
import uuid
from uuid import UUID

from django.conf import settings
from django.core.files.base import ContentFile
from django.core.files.storage import default_storage
from django.db import IntegrityError, transaction

from checkpoints import crypto
from checkpoints.errors import IntegrityFailure, InvalidRequest, NotFound, PayloadTooLarge
from checkpoints.models import Artifact, ArtifactKind
from tenants.models import Tenant
from tenants.services import Actor, audit_record

TABLE = "artifact"
FIELD = "content"


def _seal(tenant_id: object, artifact_id: object, data: bytes) -> bytes:
    return crypto.seal(
        data, tenant_id=tenant_id, table=TABLE, row_id=artifact_id, field=FIELD
    ).encode()


def artifact_store(
    *, tenant: Tenant, data: bytes, media_type: str, kind: str = ArtifactKind.OTHER
) -> tuple[Artifact, bool]:
    """Store bytes once per tenant; return (artifact, created).

    The same bytes again return the existing artifact (created=False), also when two
    writers race. The file is written before the row, so a row never names missing content;
    a crash between the two leaves only an orphan file that retention removes.
    """
    if kind not in ArtifactKind.values:
        raise InvalidRequest(
            f"Unknown artifact kind '{kind}'; use one of {', '.join(ArtifactKind.values)}."
        )
    if len(data) > settings.CAIRN_MAX_ARTIFACT_BYTES:
        raise PayloadTooLarge(
            f"The artifact is {len(data)} bytes; the limit is {settings.CAIRN_MAX_ARTIFACT_BYTES}."
        )
    media_type = (media_type or "application/octet-stream")[:200]
    digest = hashlib.sha256(data).hexdigest()
    existing = Artifact.objects.filter(tenant=tenant, sha256=digest).first()
    if existing is not None:
        return existing, False
    artifact_id = uuid.uuid4()
    name = default_storage.save(
        f"artifacts/{tenant.id}/{artifact_id}", ContentFile(_seal(tenant.id, artifact_id, data))
    )
    try:
        with transaction.atomic():
            artifact = Artifact.objects.create(
                id=artifact_id,
                tenant=tenant,
                sha256=digest,
                size=len(data),
                media_type=media_type,
                kind=kind,
                storage_name=name,
                key_id=crypto.keyring().active_id,
            )
    except IntegrityError:
        default_storage.delete(name)
        return Artifact.objects.get(tenant=tenant, sha256=digest), False
    return artifact, True


def artifact_get(*, tenant: Tenant, artifact_id: UUID | str) -> Artifact:
    try:
        return Artifact.objects.get(tenant=tenant, pk=artifact_id)
    except (Artifact.DoesNotExist, ValueError):
        raise NotFound("No such artifact.")


def artifact_content(artifact: Artifact) -> bytes:
    """Decrypt the stored bytes and check them against the artifact's sha256.

    Raises IntegrityFailure when the file is missing, damaged or was swapped.
    """
    try:
        with default_storage.open(artifact.storage_name, "rb") as handle:
            sealed = handle.read().decode()
        data = crypto.unseal(
            sealed, tenant_id=artifact.tenant_id, table=TABLE, row_id=artifact.id, field=FIELD
        )
    except (OSError, UnicodeDecodeError, crypto.DecryptionError) as exc:
        raise IntegrityFailure(f"Artifact {artifact.id} cannot be read: {exc}")
    if hashlib.sha256(data).hexdigest() != artifact.sha256:
        raise IntegrityFailure(f"Artifact {artifact.id} content does not match its sha256.")
    return data


def artifact_read(
    *, tenant: Tenant, artifact_id: UUID | str, actor: Actor, run_id: UUID | str | None = None
) -> tuple[Artifact, bytes]:
    """Decrypted content for a person or client; the read is audited (under ``run_id``
    when the reader came through a run, so the run's audit trail shows it)."""
    artifact = artifact_get(tenant=tenant, artifact_id=artifact_id)
    data = artifact_content(artifact)
    audit_record(
        tenant=tenant,
        actor=actor,
        action="artifact.read",
        run_id=run_id,
        target=str(artifact.id),
        details={"sha256": artifact.sha256},
    )
    return artifact, data


def artifact_reseal(artifact: Artifact) -> bool:
    """Re-encrypt under the active key (key rotation). Returns True when it rewrote the file."""
    ring = crypto.keyring()
    if artifact.key_id == ring.active_id:
        return False
    data = artifact_content(artifact)
    # A new file, then the row, then the old file goes: a crash at any point leaves the row
    # naming a complete file it can decrypt.
    old_name = artifact.storage_name
    name = default_storage.save(
        f"artifacts/{artifact.tenant_id}/{artifact.id}",
        ContentFile(_seal(artifact.tenant_id, artifact.id, data)),
    )
    Artifact.objects.filter(pk=artifact.pk).update(storage_name=name, key_id=ring.active_id)
    default_storage.delete(old_name)
    return True
