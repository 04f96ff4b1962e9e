"""The store's basic reads: a tenant's run, a checkpoint's decrypted envelope, a run's
latest envelope.

Below both the commit (``checkpoints.services.checkpoints``) and the integrity checks
(``checkpoints.services.integrity``), which both need them. The audited read of one
checkpoint, which the API and the console show, is a selector (``checkpoints.selectors``).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any
from uuid import UUID

from cairn.errors import IntegrityFailure, NotFound
from checkpoints import crypto
from checkpoints.models import Checkpoint, Run
from tenants.models import Tenant

if TYPE_CHECKING:
    from checkpoints.services.commit_sql import RunHead

# What a checkpoint's envelope is sealed as (associated data of its AES-GCM seal).
TABLE = "checkpoint"
FIELD = "envelope"


def run_get(*, tenant: Tenant, run_id: UUID | str) -> Run:
    """The tenant's run, or NotFound (also for another tenant's run: existence is private)."""
    try:
        return Run.objects.select_related("workflow").get(tenant=tenant, pk=run_id)
    except (Run.DoesNotExist, ValueError):
        raise NotFound("No such run.")


def checkpoint_envelope(checkpoint: Checkpoint) -> dict[str, Any]:
    """The decrypted envelope as stored (not migrated). Raises IntegrityFailure."""
    try:
        plain = crypto.unseal(
            checkpoint.envelope_sealed,
            tenant_id=checkpoint.tenant_id,
            table=TABLE,
            row_id=checkpoint.id,
            field=FIELD,
        )
        return json.loads(plain)
    except crypto.DecryptionError as exc:
        raise IntegrityFailure(f"Checkpoint {checkpoint.sequence} cannot be decrypted: {exc}")


def latest_envelope(run: Run | RunHead) -> dict[str, Any]:
    checkpoint = Checkpoint.objects.filter(run_id=run.id, sequence=run.checkpoint_sequence).first()
    if checkpoint is None:
        return {}
    return checkpoint_envelope(checkpoint)
