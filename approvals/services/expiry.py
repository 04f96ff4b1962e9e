"""Expiry: a past-due request is marked expired and, by default, a fresh one raised once."""

from __future__ import annotations

from django.db import transaction
from django.utils import timezone

from approvals.models import LIVE_STATUSES, ApprovalRequest, ApprovalStatus
from approvals.services._common import RUN_OPEN_STATUSES, default_expiry, request_insert
from checkpoints.models import Run, RunStatus
from tenants.services import Actor, audit_record


def _renewed_once(request: ApprovalRequest) -> bool:
    """Whether ``request`` is itself the renewal of an expired request for the same run
    version and action: a request is renewed once, never in a cycle."""
    previous = request.previous
    return (
        previous is not None
        and previous.status == ApprovalStatus.EXPIRED
        and previous.run_version == request.run_version
        and previous.action == request.action
    )


def renew_expired(*, request: ApprovalRequest, run: Run, actor: Actor) -> ApprovalRequest | None:
    """The default for an expired request: while the run still waits at the bound version,
    raise a fresh request for the same artifact, once, with the workflow's approval TTL
    (CAIRN_APPROVAL_TTL_SECONDS), never the expired request's own lifetime (a request created
    to expire in 15 s would otherwise make every successor expire as fast, for ever)."""
    if run.status not in RUN_OPEN_STATUSES or run.version != request.run_version:
        return None
    if _renewed_once(request):
        return None
    if ApprovalRequest.objects.filter(
        run=run, action=request.action, status__in=LIVE_STATUSES
    ).exists():
        return None
    return request_insert(
        run=run,
        artifact=request.artifact,
        action=request.action,
        expires_at=default_expiry(timezone.now()),
        required_approvals=request.required_approvals,
        requester=request.requester,
        requester_label=request.requester_label,
        actor=actor,
    )


def _say_on_the_run(
    *, run: Run, request: ApprovalRequest, fresh: ApprovalRequest | None, was: str
) -> None:
    """Put the expiry in the run's status reason, where an operator sees it (runs list, run
    page), saying truly whether anyone had decided (``was``: the request's status before it
    expired). The version does not move: the fresh request is bound to it."""
    if run.status != RunStatus.WAITING_APPROVAL or run.version != request.run_version:
        return
    when = f"{request.expires_at:%Y-%m-%d %H:%M:%S} UTC"
    if was == ApprovalStatus.APPROVED:
        decided = request.decided_at
        at = f" at {decided:%Y-%m-%d %H:%M:%S} UTC" if decided else ""
        what = f"approval granted{at} expired at {when} before the run used it"
    else:
        what = f"approval expired at {when} with no decision"
    if fresh is not None:
        reason = (
            f"{what}; a new request was raised, open until {fresh.expires_at:%Y-%m-%d %H:%M:%S} UTC"
        )
    else:
        reason = (
            f"{what}, again: no new request is raised. "
            "Retry the step before the approval state to ask again, or cancel the run"
        )
    Run.objects.filter(pk=run.pk, version=run.version).update(status_reason=reason)


def expire_request(*, request: ApprovalRequest, actor: Actor, renew: bool = True) -> bool:
    """Mark a live, past-due request expired (conditional UPDATE) and, by default, raise its
    successor once (``renew_expired``) and say so in the run's status reason. Call inside a
    transaction. Returns whether this call expired it."""
    now = timezone.now()
    # Whether anyone decided, as the row says now (the caller's copy may be older).
    current = (
        ApprovalRequest.objects.select_for_update()
        .filter(pk=request.pk)
        .values("status", "decided_at")
        .first()
    )
    if current is None:
        return False
    was = current["status"]
    request.decided_at = current["decided_at"]
    changed = ApprovalRequest.objects.filter(
        pk=request.pk, status__in=LIVE_STATUSES, expires_at__lte=now
    ).update(
        status=ApprovalStatus.EXPIRED,
        status_reason=f"Expired at {request.expires_at:%Y-%m-%d %H:%M:%S} UTC.",
    )
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
        fresh = renew_expired(request=request, run=run, actor=actor)
        _say_on_the_run(run=run, request=request, fresh=fresh, was=was)
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
