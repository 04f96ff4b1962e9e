"""Pausing a run: an operator's hold, apart from cancel (which ends the run) and from
retention's legal hold (which keeps its data).

A paused run keeps its status, its position and its version, so a step a worker is running
when the pause comes still finishes and commits; the worker then stops at the next step
boundary instead of going on. While the run is paused nothing dispatches it: the outbox
relay publishes none of its ``run.resume`` commands (``checkpoints.services.outbox``), so a
resume, a retry, an approval decision or the rescue sweep only queue theirs, and a worker
that receives a command sent before the pause does not start a step. Unpausing publishes
the held command, or queues one when none is held. See docs/design.md, "Pausing a run".
"""

from __future__ import annotations

import logging
from uuid import UUID

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from cairn.errors import ActionNotAllowed, RunNotActive
from checkpoints.approvals_port import approvals_port
from checkpoints.models import Execution, OutboxMessage, Run, RunStatus
from checkpoints.services import outbox
from checkpoints.services.changes import run_changed
from runtime.services.actions import (
    FINISHED,
    enqueue_continue,
    locked_run,
    reason_clean,
    run_reload,
    version_check,
)
from telemetry.logs import transition_log
from tenants.models import Tenant
from tenants.services import Actor, audit_record

log = logging.getLogger("cairn.actions")

# Statuses a worker may carry a run on from: an unpaused run in one of these gets its
# command back.
DISPATCHED = frozenset(
    {RunStatus.RUNNING, RunStatus.WAITING_RETRY, RunStatus.WAITING_APPROVAL, RunStatus.RECONCILING}
)


def pause_refusal(run: Run) -> str:
    """Why ``run`` cannot be paused now, or ""."""
    if run.paused:
        return "The run is already paused; unpause it to let it go on."
    if run.status in FINISHED or run.status == RunStatus.FAILED:
        return f"The run is {run.status}; there is nothing to pause."
    if run.status == RunStatus.CANCELLING:
        return "The run is being cancelled; there is nothing to pause."
    return ""


def unpause_refusal(run: Run) -> str:
    """Why ``run`` cannot be unpaused, or ""."""
    if not run.paused:
        return "The run is not paused; there is nothing to unpause."
    return ""


def _carried_on(run: Run) -> bool:
    """Whether a worker would carry ``run`` on once it has its command: a worker run that is
    running, reconciling, waiting for a retry, or waiting at an approval already decided."""
    if run.execution != Execution.WORKER or run.status not in DISPATCHED:
        return False
    if run.status == RunStatus.WAITING_APPROVAL:
        return approvals_port().approved_request_id(run=run) is not None
    return True


def run_pause(
    *,
    tenant: Tenant,
    run_id: UUID | str,
    reason: str,
    expected_version: int | None = None,
    actor: Actor,
) -> Run:
    """Hold the run: no command of it is dispatched and no worker starts a step for it until
    ``run_unpause``. A step in flight finishes and commits (the version does not move, so its
    commit is not refused); its worker stops after it. One transaction with the audit event.

    Raises NotFound, InvalidRequest (no reason), ConcurrentCheckpointWrite (a stale
    ``expected_version``) or ActionNotAllowed (already paused, ended, failed or cancelling).
    """
    reason = reason_clean(reason)
    with transaction.atomic():
        run = locked_run(tenant=tenant, run_id=run_id)
        version_check(run, expected_version)
        refusal = pause_refusal(run)
        if refusal:
            raise ActionNotAllowed(refusal)
        in_flight = run.lease_held()
        # Conditional on the row as read (locked): a concurrent pause writes nothing twice.
        Run.objects.filter(pk=run.pk, paused=False).update(
            paused=True,
            pause_reason=f"paused by {actor.name}: {reason}"[:2000],
            updated_at=timezone.now(),
        )
        _announce(run)
        audit_record(
            tenant=tenant,
            actor=actor,
            action="run.pause",
            run_id=run.id,
            target=f"run {run.id}",
            reason=reason,
            details={
                "status": run.status,
                "version": run.version,
                # A worker held the lease: its step finishes and commits, then it stops.
                "step_in_flight": in_flight,
            },
        )
        transition_log(
            event="run paused",
            run_id=run.id,
            tenant=tenant.slug,
            sequence=run.checkpoint_sequence,
            state=run.state,
            step=run.step,
            status=run.status,
        )
    return run_reload(run)


def run_unpause(
    *,
    tenant: Tenant,
    run_id: UUID | str,
    reason: str = "",
    expected_version: int | None = None,
    actor: Actor,
) -> Run:
    """Lift the hold: the run's held ``run.resume`` commands are published again, or, for a
    worker run that a worker would carry on (running, reconciling, a retry, an approval
    decided) and has none held, one is queued at its version (a retry's at its due time).
    One transaction with the audit event; the commands go out after it commits.

    Raises NotFound, InvalidRequest (a reason that is too long or a credential),
    ConcurrentCheckpointWrite or RunNotActive (the run is not paused).
    """
    reason = reason_clean(reason, required=False)
    with transaction.atomic():
        run = locked_run(tenant=tenant, run_id=run_id)
        version_check(run, expected_version)
        refusal = unpause_refusal(run)
        if refusal:
            raise RunNotActive(refusal)
        Run.objects.filter(pk=run.pk).update(
            paused=False, pause_reason="", updated_at=timezone.now()
        )
        _announce(run)
        run.paused = False
        held = list(
            OutboxMessage.objects.filter(run=run, kind="run.resume", sent_at__isnull=True)
            .order_by("id")
            .values_list("id", flat=True)
        )
        queued = None
        if not held and _carried_on(run):
            # A retry's command waits for its due time, as the retry's own did.
            due = run.next_eligible_at if run.status == RunStatus.WAITING_RETRY else None
            enqueue_continue(run, run.version, available_at=due)
            queued = run.version
        audit_record(
            tenant=tenant,
            actor=actor,
            action="run.unpause",
            run_id=run.id,
            target=f"run {run.id}",
            reason=reason,
            details={"status": run.status, "released_commands": held, "queued_for": queued},
        )
        if held and settings.CAIRN_DISPATCH_ON_COMMIT:
            transaction.on_commit(lambda: outbox.outbox_dispatch(message_ids=held))
    return run_reload(run)


def _announce(run: Run) -> None:
    # A pause moves no version, so version_bump's announcement never happens: an external
    # run's runner may be long-polling `next`, whose answer this changes.
    if run.execution == Execution.EXTERNAL:
        run_changed(run_id=run.pk)
