"""Reads shared by the API and the console, with the tenant filter built in: the runs a
list shows, and one checkpoint's envelope, checked against its row and audited."""

from __future__ import annotations

from typing import Any
from uuid import UUID

from django.db.models import QuerySet

from cairn.errors import NotFound
from checkpoints.models import Checkpoint, Run
from checkpoints.services.integrity import checkpoint_columns_verify
from checkpoints.services.reads import checkpoint_envelope, run_get
from tenants.models import Tenant
from tenants.services import Actor, audit_record


def runs_for_tenant(
    tenant: Tenant,
    *,
    status: str | None = None,
    state: str | None = None,
    workflow_type: str | None = None,
    paused: bool | None = None,
) -> QuerySet[Run]:
    runs = Run.objects.filter(tenant=tenant).select_related("forked_from_checkpoint")
    if paused is not None:  # an operator's hold (runtime.services.pause)
        runs = runs.filter(paused=paused)
    if status:
        runs = runs.filter(status=status)
    if state:
        runs = runs.filter(state=state)
    if workflow_type:
        runs = runs.filter(workflow_type=workflow_type)
    return runs


def checkpoint_get(*, tenant: Tenant, run_id: UUID | str, sequence: int) -> Checkpoint:
    run = run_get(tenant=tenant, run_id=run_id)
    checkpoint = Checkpoint.objects.filter(run=run, sequence=sequence).first()
    if checkpoint is None:
        raise NotFound(f"The run has no checkpoint {sequence}.")
    return checkpoint


def checkpoint_read(
    *, tenant: Tenant, run_id: UUID | str, sequence: int, actor: Actor
) -> tuple[Checkpoint, dict[str, Any]]:
    """The decrypted envelope of one checkpoint; the read is audited. Raises NotFound, or
    IntegrityFailure when it cannot be decrypted or its row's position is not its own."""
    checkpoint = checkpoint_get(tenant=tenant, run_id=run_id, sequence=sequence)
    envelope = checkpoint_envelope(checkpoint)
    checkpoint_columns_verify(checkpoint, envelope)
    audit_record(
        tenant=tenant,
        actor=actor,
        action="checkpoint.read",
        run_id=checkpoint.run_id,
        target=f"checkpoint {sequence}",
    )
    return checkpoint, envelope
