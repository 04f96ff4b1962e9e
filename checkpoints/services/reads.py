"""The store's basic reads: a run (with its workflow and tenant), a run's checkpoint, a
checkpoint's decrypted envelope, a run's latest envelope, and a runner's token with the
head of the run it commits to.

The run and its checkpoint are read by every API request about a run and by every worker
task before its first step, so each is one prepared statement (``tenants.prepared``) whose
row becomes the instances the ORM would have built (what it saves: docs/performance.md).

Below both the commit (``checkpoints.services.checkpoints``) and the integrity checks
(``checkpoints.services.integrity``), which both need them. The audited read of one
checkpoint, which the API and the console show, is a selector (``checkpoints.selectors``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from uuid import UUID

from cairn.errors import IntegrityFailure, NotFound
from checkpoints import crypto
from checkpoints.models import Checkpoint, Run, WorkflowDefinition
from checkpoints.services import commit_sql
from tenants.models import ApiToken, Tenant
from tenants.prepared import (
    POSTGRES,
    SQLITE,
    Dialect,
    model_columns,
    model_from_row,
    statement_fetchone,
)
from tenants.services import token_accept, token_digest

if TYPE_CHECKING:
    from checkpoints.services.commit_sql import RunHead

# What a checkpoint's envelope is sealed as (associated data of its AES-GCM seal).
TABLE = "checkpoint"
FIELD = "envelope"


def _run_read(d: Dialect) -> str:
    return (
        f"SELECT {model_columns(Run, 'r')}, {model_columns(WorkflowDefinition, 'w')}, "
        f"{model_columns(Tenant, 't')} FROM {Run._meta.db_table} r "
        f"JOIN {WorkflowDefinition._meta.db_table} w ON w.id = r.workflow_id "
        f"JOIN {Tenant._meta.db_table} t ON t.id = r.tenant_id "
        f"WHERE r.id = {d.p('run_id', 'uuid')}"
    )


def _checkpoint_read(d: Dialect) -> str:
    return (
        f"SELECT {model_columns(Checkpoint, 'c')} FROM {Checkpoint._meta.db_table} c "
        f"WHERE c.run_id = {d.p('run_id', 'uuid')} AND c.sequence = {d.p('sequence', 'bigint')}"
    )


# Each statement as each database spells it, built once.
_RUN_READ = (_run_read(POSTGRES), _run_read(SQLITE))
_CHECKPOINT_READ = (_checkpoint_read(POSTGRES), _checkpoint_read(SQLITE))
_RUN_COLUMNS = len(Run._meta.concrete_fields)
_WORKFLOW_COLUMNS = len(WorkflowDefinition._meta.concrete_fields)


def run_read(*, run_id: UUID | str) -> Run | None:
    """The run with its workflow and tenant loaded (one statement), or None. Not scoped to
    a tenant: for the worker, which has a run id from a command; a request asks
    ``run_get``."""
    try:
        run_uuid = run_id if isinstance(run_id, UUID) else UUID(str(run_id))
    except ValueError:
        return None
    row = statement_fetchone(*_RUN_READ, {"run_id": run_uuid})
    if row is None:
        return None
    workflow_end = _RUN_COLUMNS + _WORKFLOW_COLUMNS
    run = model_from_row(Run, row[:_RUN_COLUMNS])
    run.workflow = model_from_row(WorkflowDefinition, row[_RUN_COLUMNS:workflow_end])
    run.tenant = model_from_row(Tenant, row[workflow_end:])
    return run


def run_get(*, tenant: Tenant, run_id: UUID | str) -> Run:
    """The tenant's run (its workflow loaded), or NotFound, also for another tenant's run:
    existence is private."""
    run = run_read(run_id=run_id)
    if run is None or run.tenant_id != tenant.pk:
        raise NotFound("No such run.")
    run.tenant = tenant
    return run


def checkpoint_at(*, run_id: UUID, sequence: int) -> Checkpoint | None:
    """The run's checkpoint at ``sequence`` (one statement), or None."""
    row = statement_fetchone(*_CHECKPOINT_READ, {"run_id": run_id, "sequence": sequence})
    return None if row is None else model_from_row(Checkpoint, row)


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
    checkpoint = checkpoint_at(run_id=run.id, sequence=run.checkpoint_sequence)
    if checkpoint is None:
        return {}
    return checkpoint_envelope(checkpoint)


@dataclass(frozen=True)
class RunnerRead:
    """A runner's token, authenticated, and the head of the run its request names in the
    token's tenant (None when that tenant has no such run)."""

    token: ApiToken
    head: RunHead | None


def runner_read(*, secret: str, run_id: UUID) -> RunnerRead | None:
    """The token ``secret`` authenticates (``token_authenticate``'s rule: ``token_digest``
    and ``token_accept``) and, in the same statement, the head of ``run_id`` in that
    token's own tenant. None when the secret authenticates no token."""
    digest = token_digest(secret)
    found = None if digest is None else commit_sql.token_head_read(key_sha256=digest, run_id=run_id)
    token = token_accept(None if found is None else found[0])
    return None if token is None else RunnerRead(token=token, head=found[1])
