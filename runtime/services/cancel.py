"""Cancelling a run, and how a cancel waits for side effects that may be in flight.

A run whose operations are all settled (confirmed or failed) is cancelled at once. One with
an operation that is reserved, pending or unknown may have an effect in flight or one that
happened without our knowing, so ``run_cancel`` moves it to ``cancelling`` (its version
moves, so no worker commits for it again) and then tries to settle those operations:

1. ``run_cancel_settle`` asks each operation's provider through the reconciler
   (``runtime.services.reconcile.operation_reconcile``): a confirmed or failed answer
   settles it; "cannot tell" makes it ``unknown`` for a person to decide; a provider that
   has no record of a reserved or pending operation, while no worker holds the run's
   lease, means it was never performed: it is failed with that reason.
2. ``run_cancel_complete`` (in ``runtime.services.cancel_finish``) then moves the run to
   ``cancelled`` once nothing is open. It is the hook for everyone who settles an
   operation of a cancelling run: the operation services (``operation_confirm`` /
   ``operation_fail``) call it in their transaction, so an outcome recorded by an operator
   or the reconciler finishes the cancel at once. Calling it is cheap and idempotent.
3. ``runs_cancel_sweep`` repeats 1-2 for every cancelling run (the periodic safety net, for
   providers that were unavailable and outcomes recorded through the API).
"""

from __future__ import annotations

import logging
from uuid import UUID

from django.db import transaction

from cairn import clock
from cairn.errors import CairnError, RunNotActive
from checkpoints.approvals_port import approvals_port
from checkpoints.models import OperationStatus, Run, RunStatus
from checkpoints.services import outbox
from runtime.services.actions import (
    FINISHED,
    locked_run,
    reason_clean,
    run_reload,
    said,
    version_bump,
    version_check,
)
from runtime.services.cancel_finish import cancel_blocking_operations, run_cancel_complete
from tenants.models import Tenant
from tenants.services import Actor, audit_record

log = logging.getLogger("cairn.actions")


def cancel_refusal(run: Run) -> RunNotActive | None:
    """Why ``run_cancel`` refuses the run, or None: the one rule the service raises and the
    console's actions panel asks before it offers Cancel."""
    if run.status in FINISHED or run.status == RunStatus.FAILED:
        return RunNotActive(f"The run is already {run.status}; there is nothing to cancel.")
    if run.status == RunStatus.CANCELLING:
        return RunNotActive(
            "The run is already being cancelled; it finishes once its open operations are settled."
        )
    return None


def run_cancel(
    *,
    tenant: Tenant,
    run_id: UUID | str,
    reason: str,
    expected_version: int | None = None,
    actor: Actor,
    settle: bool = True,
) -> Run:
    """Stop a run: ``cancelled`` at once when no operation is open, otherwise ``cancelling``
    and then (``settle``) an immediate attempt to settle the open operations and finish.

    The status change, the audit event and the ``run.cancel_requested`` event are one
    transaction; settling happens after it commits (it asks providers, which must not hold
    a transaction open). Without ``expected_version`` the run's current version is used (the
    conditional update still refuses a concurrent change). Raises NotFound, InvalidRequest
    (no reason), ConcurrentCheckpointWrite or RunNotActive (finished, failed, cancelling).
    """
    reason = reason_clean(reason)
    with transaction.atomic():
        run = locked_run(tenant=tenant, run_id=run_id)
        expected = version_check(run, expected_version)
        refusal = cancel_refusal(run)
        if refusal:
            raise refusal
        keys = list(cancel_blocking_operations(run).values_list("idempotency_key", flat=True))
        if keys:
            status = RunStatus.CANCELLING
            status_reason = said(
                f"cancel requested by {actor.name}; waiting for {len(keys)} open "
                "operation(s) to be settled",
                reason,
            )
        else:
            status, status_reason = RunStatus.CANCELLED, said(f"cancelled by {actor.name}", reason)
        previous = run.status
        version = version_bump(
            run, expected, status=status, status_reason=status_reason, next_eligible_at=None
        )
        # A cancelled (or cancelling) run never continues: its live requests are closed now,
        # so reviewers' queues and cairn_approvals{state="waiting"} stop counting it.
        approvals_port().approval_requests_close(
            run=run, reason=f"The run was cancelled by {actor.name}: {reason}", actor=actor
        )
        if keys:
            outbox.outbox_enqueue(
                run=run,
                kind="run.cancel_requested",
                payload={"run_id": str(run.id), "expected_version": version, "operations": keys},
            )
        audit_record(
            tenant=tenant,
            actor=actor,
            action="run.cancel",
            run_id=run.id,
            target=f"run {run.id}",
            reason=reason,
            details={"from_status": previous, "status": status, "open_operations": keys},
        )
    if keys and settle:
        run_cancel_settle(tenant=tenant, run_id=run.id, actor=actor)
    return run_reload(run)


def run_cancel_settle(*, tenant: Tenant, run_id: UUID | str, actor: Actor) -> bool:
    """Ask the providers about a cancelling run's open operations, record the answers, and
    finish the cancel when nothing is left open. Returns whether this call ended the cancel
    (False for a run that was not cancelling).

    Each record is its own transaction (the reconciler's); a provider that cannot be reached
    leaves its operation for the next sweep. Never raises for a provider's answer.
    """
    from runtime.providers.base import Outcome
    from runtime.services.operations import operation_fail, operation_mark_unknown
    from runtime.services.reconcile import operation_reconcile

    run = Run.objects.filter(tenant=tenant, pk=run_id).first()
    if run is None or run.status != RunStatus.CANCELLING:
        return False
    for operation in cancel_blocking_operations(run):
        try:
            answer = operation_reconcile(operation=operation, actor=actor)
            operation.refresh_from_db()
            if operation.status not in (OperationStatus.RESERVED, OperationStatus.PENDING):
                continue
            # Never performed only if no worker may be performing it right now: the lease,
            # read on the database's clock (nothing checks this decision again).
            if answer.outcome == Outcome.NOT_FOUND and not run.lease_held(clock.db_now()):
                operation_fail(
                    operation_id=operation.id,
                    reason="the run was cancelled before this operation was performed "
                    "(the provider has no record of it)",
                    actor=actor,
                )
            elif answer.outcome == Outcome.UNKNOWN:
                operation_mark_unknown(operation_id=operation.id, actor=actor, reason=answer.reason)
        except CairnError as exc:
            # Settled concurrently by someone else, or refused: the sweep looks again.
            log.info(
                "cancel settlement skipped an operation",
                extra={"run": str(run.id), "operation": operation.idempotency_key, "why": exc},
            )
    # Settling the last operation usually finished the cancel already (the operation services
    # call run_cancel_complete); this catches a run whose operations were settled before.
    run_cancel_complete(tenant=tenant, run_id=run.id, actor=actor)
    return Run.objects.filter(pk=run.pk, status=RunStatus.CANCELLED).exists()


def runs_cancel_sweep(*, limit: int = 100) -> int:
    """Settle and finish cancelling runs, oldest first (any tenant); return how many were
    cancelled. Meant for a periodic task."""
    actor = Actor.system("cancel-sweep")
    runs = Run.objects.filter(status=RunStatus.CANCELLING).select_related("tenant")
    return sum(
        run_cancel_settle(tenant=run.tenant, run_id=run.id, actor=actor)
        for run in runs.order_by("updated_at")[:limit]
    )
