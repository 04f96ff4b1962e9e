"""Helpers for the in-process runtime tests: advance a run as a named worker, read
envelopes, and write a checkpoint directly (as an older Cairn or a damaged store would)."""

from __future__ import annotations

import uuid
from typing import Any

from checkpoints import crypto
from checkpoints import envelope as env
from checkpoints.models import Checkpoint, Run
from checkpoints.services.checkpoints import envelope_seal
from checkpoints.services.reads import checkpoint_envelope
from runtime.executor import run_advance
from runtime.services.runs import run_create
from tenants.services import Actor


def start(tenant, workflow_type: str, *, budget=None, **inputs) -> Run:  # noqa: ANN001
    return run_create(
        tenant=tenant,
        workflow_type=workflow_type,
        inputs=inputs,
        budget=budget or {"max_attempts": 20},
        actor=Actor.system("test"),
    )


def advance(run: Run, *, owner: str = "worker-a", version: int | None = None) -> str:
    """Deliver the run's current command (or one for ``version``) to a worker."""
    run.refresh_from_db()
    return run_advance(
        run_id=run.pk, expected_version=run.version if version is None else version, owner=owner
    )


def envelope_at(run: Run, sequence: int) -> dict[str, Any]:
    return checkpoint_envelope(Checkpoint.objects.get(run=run, sequence=sequence))


def checkpoint_write_raw(
    run: Run,
    envelope: dict[str, Any],
    *,
    state: str,
    step: str = "",
    schema_version: int,
    sha256: str | None = None,
) -> Checkpoint:
    """Append a checkpoint the way no current writer would (old schema, bad hash) and move
    the run's head to it. ``envelope['identity']`` is filled in to link to the head."""
    run.refresh_from_db()
    checkpoint_id = uuid.uuid4()
    sequence = run.checkpoint_sequence + 1
    envelope = dict(envelope)
    # The row's position is the envelope's, as every writer keeps it (restore checks it).
    if isinstance(envelope.get("position"), dict):
        envelope["position"] = {**envelope["position"], "state": state, "step": step}
    elif "state" in envelope:
        envelope["state"], envelope["step"] = state, step
    envelope["identity"] = {
        "run_id": str(run.pk),
        "workflow_type": run.workflow_type,
        "workflow_version": run.workflow_version,
        "checkpoint_id": str(checkpoint_id),
        "parent_checkpoint_id": str(run.latest_checkpoint_id),
        "sequence": sequence,
        "parent_sha256": run.latest_checkpoint_sha256,
    }
    digest = sha256 or env.sha256_of(envelope)
    checkpoint = Checkpoint.objects.create(
        id=checkpoint_id,
        tenant_id=run.tenant_id,
        run=run,
        sequence=sequence,
        parent_id=run.latest_checkpoint_id,
        state=state,
        step=step,
        schema_version=schema_version,
        envelope_sealed=envelope_seal(
            tenant_id=run.tenant_id, checkpoint_id=checkpoint_id, envelope=envelope
        ),
        key_id=crypto.keyring().active_id,
        sha256=digest,
        parent_sha256=run.latest_checkpoint_sha256,
        actor="older cairn",
    )
    Run.objects.filter(pk=run.pk).update(
        state=state,
        step=step,
        version=run.version + 1,
        checkpoint_sequence=sequence,
        latest_checkpoint_id=checkpoint.id,
        latest_checkpoint_sha256=digest,
    )
    run.refresh_from_db()
    return checkpoint
