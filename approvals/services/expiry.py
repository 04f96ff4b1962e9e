"""Expiry: a past-due request is marked expired and, by default, a fresh one raised."""

from __future__ import annotations

from datetime import timedelta

from django.db import transaction
from django.utils import timezone

from approvals.models import LIVE_STATUSES, ApprovalRequest, ApprovalStatus
from approvals.services._common import RUN_OPEN_STATUSES, request_insert
from checkpoints.models import Run
from tenants.services import Actor, audit_record


def renew_expired(*, request: ApprovalRequest, run: Run, actor: Actor) -> ApprovalRequest | None:
    """The default for an expired request: while the run still waits at the bound version,
    raise a fresh request for the same artifact with a new expiry of the same length."""
    if run.status not in RUN_OPEN_STATUSES or run.version != request.run_version:
        return None
    if ApprovalRequest.objects.filter(
        run=run, action=request.action, status__in=LIVE_STATUSES
    ).exists():
        return None
    lifetime = max(request.expires_at - request.created_at, timedelta(seconds=60))
    return request_insert(
        run=run,
        artifact=request.artifact,
        action=request.action,
        expires_at=timezone.now() + lifetime,
        required_approvals=request.required_approvals,
        requester=request.requester,
        requester_label=request.requester_label,
        actor=actor,
    )


def expire_request(*, request: ApprovalRequest, actor: Actor, renew: bool = True) -> bool:
    """Mark a live, past-due request expired (conditional UPDATE) and, by default, raise its
    successor. Call inside a transaction. Returns whether this call expired it."""
    now = timezone.now()
    changed = ApprovalRequest.objects.filter(
        pk=request.pk, status__in=LIVE_STATUSES, expires_at__lte=now
    ).update(status=ApprovalStatus.EXPIRED, status_reason=f"Expired at {request.expires_at}.")
    if not changed:
        return False
    request.status = ApprovalStatus.EXPIRED
    audit_record(
        tenant=request.tenant,
        actor=actor,
        action="approval.expired",
        run_id=request.run_id,
        target=str(request.pk),
        details={"expires_at": request.expires_at.isoformat()},
    )
    if renew:
        run = Run.objects.select_for_update().get(pk=request.run_id)
        renew_expired(request=request, run=run, actor=actor)
    return True


def approval_expire_due(*, limit: int = 500) -> int:
    """Expire every live request past its expiry (the periodic task). Returns how many.

    Each request is expired in its own transaction with its audit event and, while its run
    still waits at the bound version, a fresh request for the same artifact. Safe to run
    concurrently: the status change is a conditional UPDATE.
    """
    actor = Actor.system("approval-expiry")
    due = list(
        ApprovalRequest.objects.filter(status__in=LIVE_STATUSES, expires_at__lte=timezone.now())
        .select_related("tenant", "artifact", "requester")
        .order_by("expires_at")[:limit]
    )
    expired = 0
    for request in due:
        with transaction.atomic():
            expired += expire_request(request=request, actor=actor)
    # Runs a worker finished (or failed) while a request was live never use it again.
    from approvals.services.closing import approval_close_ended

    with transaction.atomic():
        approval_close_ended(limit=limit)
    return expired
