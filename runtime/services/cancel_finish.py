"""The end of a cancel: a ``cancelling`` run becomes ``cancelled`` once none of its
operations may still be in flight (``runtime.services.cancel`` starts and settles cancels).

The operation services call ``run_cancel_complete`` when they settle an operation of a
cancelling run, so this module sits below both them and ``cancel``.
"""

from __future__ import annotations

import logging
from uuid import UUID

from django.db import transaction
from django.db.models import QuerySet

from checkpoints.models import ExternalOperation, OperationStatus, Run, RunStatus
from runtime.services.actions import locked_run, version_bump
from tenants.models import Tenant
from tenants.services import Actor, audit_record

log = logging.getLogger("cairn.actions")

# Wider than the reconciler's open statuses: an API caller may call its provider while the
# operation is only reserved, so a reserved one may have happened too.
CANCEL_BLOCKING_STATUSES = (
    OperationStatus.RESERVED,
    OperationStatus.PENDING,
    OperationStatus.UNKNOWN,
)


def cancel_blocking_operations(run: Run) -> QuerySet[ExternalOperation]:
    return ExternalOperation.objects.filter(run=run, status__in=CANCEL_BLOCKING_STATUSES).order_by(
        "created_at", "id"
    )


def run_cancel_complete(*, tenant: Tenant, run_id: UUID | str, actor: Actor) -> bool:
    """Finish the cancel of a ``cancelling`` run once none of its operations is open.

    Returns True when it moved the run to ``cancelled``, False when the run is not
    cancelling or still has open operations. One transaction with its audit event
    ``run.cancel_completed``. Raises NotFound.
    """
    with transaction.atomic():
        run = locked_run(tenant=tenant, run_id=run_id)
        if run.status != RunStatus.CANCELLING or cancel_blocking_operations(run).exists():
            return False
        version = version_bump(
            run,
            run.version,
            status=RunStatus.CANCELLED,
            status_reason="cancelled: every open operation was settled first",
        )
        settled = dict(
            ExternalOperation.objects.filter(run=run).values_list("idempotency_key", "status")
        )
        audit_record(
            tenant=tenant,
            actor=actor,
            action="run.cancel_completed",
            run_id=run.id,
            target=f"run {run.id}",
            details={"version": version, "operations": settled},
        )
    log.info("run cancelled after its operations were settled", extra={"run": str(run.id)})
    return True
