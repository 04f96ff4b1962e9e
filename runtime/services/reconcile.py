"""Reconciliation: before a restored run writes anything new, ask each provider what became
of the run's operations whose outcome Cairn does not know, and record the answer.

Per open operation the provider's lookup (by idempotency key, then client reference) says:

    confirmed    → the operation is confirmed with the provider's id and result
    failed       → the operation is failed with the provider's reason
    not found    → a pending operation stays pending: the provider never performed it, so the
                   step sends it again with the same key (which the provider deduplicates)
    running      → (a long-running tool whose job id is recorded: ``job_status``, not
                   lookup) it stays pending; the step observes the same job again
    cannot tell  → the operation becomes unknown: the run waits for a person
    unavailable  → nothing is recorded but a note: ask again later

Nothing here calls ``perform``: reconciliation only asks.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from django.db import transaction
from django.utils import timezone

from checkpoints.models import ExternalOperation, OperationStatus, Run, RunStatus
from runtime.providers.base import Outcome, Provider, ProviderResult, supports_jobs
from runtime.providers.registry import UnknownProvider, provider_get
from runtime.services.operations import (
    operation_confirm,
    operation_fail,
    operation_mark_unknown,
    operation_note,
    operations_open,
    operations_open_exist,
)
from tenants.services import Actor

log = logging.getLogger("cairn.operations")


@dataclass
class ReconcileReport:
    """What reconciling a run found, by idempotency key."""

    confirmed: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    not_found: list[str] = field(default_factory=list)
    unknown: list[str] = field(default_factory=list)
    unavailable: list[str] = field(default_factory=list)
    reasons: dict[str, str] = field(default_factory=dict)

    @property
    def pause_reason(self) -> str | None:
        """A sentence naming every operation a person must settle, or None."""
        if not self.unknown:
            return None
        named = "; ".join(f"{key}: {self.reasons.get(key, 'cannot tell')}" for key in self.unknown)
        return (
            f"The outcome of external operation(s) cannot be told ({named}). Find out at the "
            "provider whether it happened, record the outcome (confirmed with the provider's "
            "id, or failed), then resume the run."
        )

    @property
    def retry_reason(self) -> str | None:
        """A sentence naming the operations whose provider could not be asked, or None."""
        if not self.unavailable:
            return None
        named = "; ".join(f"{key}: {self.reasons.get(key, '')}" for key in self.unavailable)
        return f"The provider of external operation(s) could not be asked ({named})."


def _provider_for(operation: ExternalOperation) -> Provider | None:
    if not operation.provider:
        return None
    try:
        return provider_get(operation.provider)
    except UnknownProvider:
        return None


def operation_reconcile(
    *, operation: ExternalOperation, actor: Actor, provider: Provider | None = None
) -> ProviderResult:
    """Ask the provider about one open operation and record what it says (see the module
    docstring). Each record is its own transaction; an operation settled meanwhile by
    someone else is left as they settled it. Returns the provider's answer."""
    provider = provider or _provider_for(operation)
    if provider is None:
        answer = ProviderResult(
            Outcome.UNKNOWN,
            reason=f"no provider adapter named '{operation.provider}' can be asked",
        )
    elif operation.provider_job_id and supports_jobs(provider):
        # A long-running tool with a recorded job: observe that job, never submit again.
        answer = provider.job_status(job_id=operation.provider_job_id)
        if answer.outcome == Outcome.NOT_FOUND:
            answer = ProviderResult(
                Outcome.UNKNOWN,
                reason=f"the provider has no job {operation.provider_job_id}",
                job_id=operation.provider_job_id,
            )
    else:
        answer = provider.lookup(
            key=operation.idempotency_key, client_reference=operation.client_reference
        )
    log.info(
        "operation reconciled",
        extra={
            "run": str(operation.run_id),
            "operation": operation.idempotency_key,
            "outcome": str(answer.outcome),
        },
    )
    if answer.outcome == Outcome.CONFIRMED:
        operation_confirm(
            operation_id=operation.id,
            provider_operation_id=answer.provider_operation_id,
            result=answer.result,
            actor=actor,
            reason="confirmed by the provider's lookup",
        )
    elif answer.outcome == Outcome.FAILED:
        operation_fail(operation_id=operation.id, reason=answer.reason, actor=actor)
    elif answer.outcome == Outcome.UNKNOWN and operation.status == OperationStatus.PENDING:
        operation_mark_unknown(operation_id=operation.id, actor=actor, reason=answer.reason)
    else:
        what = "job" if answer.outcome == Outcome.RUNNING else "lookup"
        operation_note(
            operation_id=operation.id,
            note=f"{timezone.now():%Y-%m-%dT%H:%M:%SZ} {what}: {answer.reason or answer.outcome}",
        )
    return answer


def run_reconcile(*, run: Run, actor: Actor) -> ReconcileReport:
    """Reconcile every pending or unknown operation of ``run`` (the caller holds its lease).

    While it asks, the run's status is ``reconciling``; afterwards it is set back to what
    it was, and the caller decides from the report: pause for review (``pause_reason``),
    retry later (``retry_reason``), or go on. A run with nothing open is not touched.
    """
    report = ReconcileReport()
    if not operations_open_exist(run_id=run.pk):
        return report
    open_operations = list(operations_open(run=run))
    if not open_operations:
        return report
    # A worker that died mid-reconcile left ``reconciling`` behind: that run was running.
    previous = RunStatus.RUNNING if run.status == RunStatus.RECONCILING else run.status
    with transaction.atomic():
        Run.objects.filter(pk=run.pk, status=run.status).update(status=RunStatus.RECONCILING)
    try:
        for operation in open_operations:
            answer = operation_reconcile(operation=operation, actor=actor)
            key = operation.idempotency_key
            report.reasons[key] = answer.reason
            operation.refresh_from_db(fields=["status"])
            if operation.status == OperationStatus.CONFIRMED:
                report.confirmed.append(key)
            elif operation.status == OperationStatus.FAILED:
                report.failed.append(key)
            elif operation.status == OperationStatus.UNKNOWN:
                report.unknown.append(key)
            elif answer.outcome == Outcome.UNAVAILABLE:
                report.unavailable.append(key)
            else:
                report.not_found.append(key)
    finally:
        with transaction.atomic():
            Run.objects.filter(pk=run.pk, status=RunStatus.RECONCILING).update(status=previous)
    return report
