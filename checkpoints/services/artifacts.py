"""Artifacts: content-addressed, encrypted at rest, deduplicated per tenant.

The bytes live in Django's default storage (the filesystem under ``CAIRN_MEDIA_ROOT``, or an
S3-compatible bucket: cairn.storage). They are sealed by Cairn before they leave the process,
in chunks (checkpoints.artifact_sealing), so the storage never sees plaintext and a large
artifact is never held twice in memory. An object's name is the sha256 of its sealed bytes,
``artifacts/<tenant>/<sha256>``: a name is written once and never overwritten, which is what
lets key rotation write a new object before it lets go of the old one.

A storage that cannot take a write (a full or read-only disk, the temporary disk the sealed
bytes are spooled on, a bucket that cannot be reached) is ``StorageUnavailable`` (503 with
``Retry-After``), never an unexplained 500: the object is removed again if part of it was
written, no row names it, and what a process killed in the middle leaves behind is an
orphan the sweep removes (``retention.orphans``).
"""

from __future__ import annotations

import errno
import hashlib
import io
import logging
import tempfile
import uuid
from uuid import UUID

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.core.files.base import File
from django.core.files.storage import default_storage
from django.db import IntegrityError, transaction

from cairn.errors import (
    IntegrityFailure,
    InvalidRequest,
    NotFound,
    PayloadTooLarge,
    StorageUnavailable,
)
from checkpoints import artifact_sealing, crypto
from checkpoints.models import Artifact, ArtifactKind, ArtifactUpload
from tenants.models import Tenant
from tenants.services import Actor, audit_record

TABLE = "artifact"
FIELD = "content"
# Sealed bytes are spooled in memory up to this size, then to a temporary file, before the
# storage reads them (the S3 API needs the length or a seekable body).
SPOOL_BYTES = 1024 * 1024
logger = logging.getLogger("cairn.artifacts")


def _storage_errors() -> tuple[type[BaseException], ...]:
    errors: tuple[type[BaseException], ...] = (OSError,)
    try:  # botocore is there only when the S3 storage is installed
        from botocore.exceptions import BotoCoreError, ClientError
    except ImportError:
        return errors
    return (*errors, BotoCoreError, ClientError)


def _scope(tenant_id: object, artifact_id: object) -> dict[str, object]:
    return {"tenant_id": tenant_id, "table": TABLE, "row_id": artifact_id, "field": FIELD}


# What an OSError's errno says about the disk, in the sentence a client reads.
_DISK_STATES = {
    errno.ENOSPC: "is full",
    errno.EDQUOT: "is over its quota",
    errno.EROFS: "is read-only",
    errno.EACCES: "refuses writes",
    errno.EPERM: "refuses writes",
    errno.EIO: "failed to write (an I/O error)",
}


def storage_unavailable(exc: BaseException, *, what: str) -> StorageUnavailable:
    """The refusal for a storage error (logged with its cause; the client's sentence names
    no path or credential)."""
    logger.error(
        "artifact storage unavailable",
        extra={"what": what, "error": type(exc).__name__, "errno": getattr(exc, "errno", None)},
    )
    if isinstance(exc, OSError):
        state = _DISK_STATES.get(exc.errno, "cannot be written")
        place = "The artifact disk" if what == "storage" else "The server's temporary disk"
    else:
        place, state = "The artifact bucket", "cannot be reached or refused the write"
    return StorageUnavailable(
        f"{place} {state} right now; nothing was stored. Send the same request again later "
        "(it is safe: artifacts are stored by content)."
    )


def artifact_object_write(*, tenant_id: object, artifact_id: object, data: bytes) -> str:
    """Seal ``data`` for the artifact row and store it under a new content-addressed name;
    return the name. Nothing refers to the object until a row is written naming it.

    Raises StorageUnavailable when the temporary spool or the storage cannot take it; a
    partly written object is removed again (best effort: the orphan sweep removes it
    otherwise)."""
    with tempfile.SpooledTemporaryFile(max_size=SPOOL_BYTES) as spool:
        try:
            digest = artifact_sealing.seal_to(data, spool, scope=_scope(tenant_id, artifact_id))
            spool.seek(0)
        except OSError as exc:
            raise storage_unavailable(exc, what="spool")
        name = f"artifacts/{tenant_id}/{digest}"
        try:
            return default_storage.save(name, File(spool, name=digest))
        except _storage_errors() as exc:
            # The name is the sealed bytes' digest (a fresh nonce each time): only this
            # write can have made an object there, complete or not.
            _object_delete_quietly(name)
            raise storage_unavailable(exc, what="storage")


def _object_delete_quietly(name: str) -> None:
    # Called only once nothing refers to the object; if it fails, an orphan stays behind
    # (harmless, sealed), never a row without its object.
    try:
        default_storage.delete(name)
    except _storage_errors() as exc:
        logger.warning("artifact object %s was not deleted: %s", name, exc)


def artifact_store(
    *,
    tenant: Tenant,
    data: bytes,
    media_type: str,
    kind: str = ArtifactKind.OTHER,
    uploaded_by: AbstractBaseUser | None = None,
) -> tuple[Artifact, bool]:
    """Store bytes once per tenant; return (artifact, created).

    The same bytes again return the existing artifact (created=False), also when two
    writers race. The file is written before the row, so a row never names missing content;
    a crash between the two leaves only an orphan file that retention removes.
    ``uploaded_by`` (a person uploading over the API) is recorded either way
    (``ArtifactUpload``): the four-eyes rule keeps them from approving these bytes. Raises
    InvalidRequest, PayloadTooLarge or StorageUnavailable (nothing stored).
    """
    artifact, created = _artifact_store(tenant=tenant, data=data, media_type=media_type, kind=kind)
    if uploaded_by is not None and uploaded_by.pk:
        ArtifactUpload.objects.get_or_create(
            tenant=tenant, artifact=artifact, uploaded_by=uploaded_by
        )
    return artifact, created


def _artifact_store(
    *, tenant: Tenant, data: bytes, media_type: str, kind: str
) -> tuple[Artifact, bool]:
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
    name = artifact_object_write(tenant_id=tenant.id, artifact_id=artifact_id, data=data)
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
        _object_delete_quietly(name)
        return Artifact.objects.get(tenant=tenant, sha256=digest), False
    return artifact, True


def artifact_get(*, tenant: Tenant, artifact_id: UUID | str) -> Artifact:
    try:
        return Artifact.objects.get(tenant=tenant, pk=artifact_id)
    except (Artifact.DoesNotExist, ValueError):
        raise NotFound("No such artifact.")


def artifact_content(artifact: Artifact) -> bytes:
    """Decrypt the stored bytes and check them against the artifact's sha256.

    The object is read and decrypted chunk by chunk into the one buffer that is returned.
    Raises IntegrityFailure when the object is missing, damaged or was swapped, and
    crypto.MissingKeyError when its key is not configured.
    """
    digest, buffer = hashlib.sha256(), io.BytesIO()
    try:
        with default_storage.open(artifact.storage_name, "rb") as handle:
            for piece in artifact_sealing.unseal_from(
                handle, scope=_scope(artifact.tenant_id, artifact.id)
            ):
                digest.update(piece)
                buffer.write(piece)
    except (*_storage_errors(), crypto.DecryptionError) as exc:
        raise IntegrityFailure(f"Artifact {artifact.id} cannot be read: {exc}")
    if digest.hexdigest() != artifact.sha256:
        raise IntegrityFailure(f"Artifact {artifact.id} content does not match its sha256.")
    return buffer.getvalue()


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
    """Re-encrypt under the active key (key rotation). Returns True when it switched the row.

    A new object under a new name, then the row is switched in a transaction (only if it
    still names the old object), and the old object is deleted only after that commit. A
    crash at any point leaves the row naming a complete object it can decrypt; what a crash
    can leave behind is an unreferenced object, never a missing one.
    """
    ring = crypto.keyring()
    if artifact.key_id == ring.active_id:
        return False
    data = artifact_content(artifact)
    old_name = artifact.storage_name
    name = artifact_object_write(tenant_id=artifact.tenant_id, artifact_id=artifact.id, data=data)
    with transaction.atomic():
        switched = Artifact.objects.filter(pk=artifact.pk, storage_name=old_name).update(
            storage_name=name, key_id=ring.active_id
        )
        if switched:
            transaction.on_commit(lambda: _object_delete_quietly(old_name))
    if not switched:
        # Resealed or removed by someone else meanwhile: the new object is nobody's.
        _object_delete_quietly(name)
        return False
    artifact.storage_name, artifact.key_id = name, ring.active_id
    return True
