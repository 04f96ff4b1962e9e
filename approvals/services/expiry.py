"""Expiry: a past-due request is marked expired and, by default, a fresh one raised once;
where the approval state declares an escalation, a request that expired with no decision is
raised again to the next level's reviewers, and after the last level the run fails or is
held, as the workflow says (``after_expiry``, asked by the sweep and the worker's gate)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from django.db import transaction
from django.utils import timezone

from approvals.models import LIVE_STATUSES, ApprovalRequest, ApprovalStatus
from approvals.services._common import (
    RUN_OPEN_STATUSES,
    request_raise_again,
    run_fail_at_approval,
)
from approvals.services.standing import reviewers_declared, reviewers_label
from checkpoints.models import Execution, Run, RunStatus
from checkpoints.services.outbox import outbox_enqueue
from tenants.services import Actor, audit_record


@dataclass(frozen=True)
class AfterExpiry:
    """What follows a request's expiry: "renew" (the default: once, same reviewers),
    "escalate" (to the next level), "hold" or "fail" (the last level expired); ``reason``
    is recorded (the new request's status reason, the audit event, the run's reason)."""

    kind: Literal["renew", "escalate", "hold", "fail"]
    reason: str = ""


def after_expiry(*, request: ApprovalRequest, run: Run, was: str) -> AfterExpiry:
    """For ``request``, expired now (``was``: its status before), what the approval state
    declares next. Only a request nobody decided escalates; an approval that expired unused
    is renewed as ever."""
    declared = reviewers_declared(run=run, action=request.action, level=request.escalation_level)
    if was != ApprovalStatus.PENDING or not declared.escalation:
        return AfterExpiry("renew")
    here = reviewers_label(request)
    when = f"{request.expires_at:%Y-%m-%d %H:%M:%S} UTC"
    level = request.escalation_level
    if level < len(declared.escalation):
        upper = reviewers_declared(run=run, action=request.action, level=level + 1)
        return AfterExpiry(
            "escalate",
            f"Escalated: approval request {request.pk} for {here} expired at {when} with no "
            f"decision; now for {reviewers_label(upper)} (level {level + 1}).",
        )
    ending = "the run fails" if declared.then == "fail" else "the run is held"
    return AfterExpiry(
        declared.then,
        f"No decision on '{request.action}' after escalation: the last request, for {here}, "
        f"expired at {when}; {ending}.",
    )


def escalate(
    *, request: ApprovalRequest, run: Run, actor: Actor, after: AfterExpiry
) -> ApprovalRequest | None:
    """Carry out ``after`` for an expired request (inside the caller's transaction, the run
    locked): raise the next level's request, or record the hold, or fail the run (an
    externally driven one here; a worker run through its gate, which the resume wakes)."""
    audit_record(
        tenant=request.tenant,
        actor=actor,
        action="approval.escalated" if after.kind == "escalate" else "approval.escalation_ended",
        run_id=run.pk,
        target=str(request.pk),
        reason=after.reason,
        details={"level": request.escalation_level, "outcome": after.kind},
    )
    if after.kind == "escalate":
        return request_raise_again(
            request=request,
            run=run,
            actor=actor,
            escalation_level=request.escalation_level + 1,
            reason=after.reason,
        )
    if after.kind == "fail" and run.status in RUN_OPEN_STATUSES:
        if run.execution == Execution.WORKER:
            outbox_enqueue(
                run=run,
                kind="run.resume",
                payload={"run_id": str(run.pk), "expected_version": run.version},
            )
        else:
            run_fail_at_approval(
                request=request,
                run=run,
                actor=actor,
                reason=after.reason,
                status_reason=after.reason,
            )
    return None


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


def renew_expired(
    *, request: ApprovalRequest, run: Run, actor: Actor, was: str = ApprovalStatus.PENDING
) -> ApprovalRequest | None:
    """The default for an expired request: while the run still waits at the bound version,
    raise a fresh request for the same artifact, once, with the workflow's approval TTL
    (CAIRN_APPROVAL_TTL_SECONDS), never the expired request's own lifetime (a request created
    to expire in 15 s would otherwise make every successor expire as fast, for ever)."""
    if run.status not in RUN_OPEN_STATUSES or run.version != request.run_version:
        return None
    after = after_expiry(request=request, run=run, was=was)
    if after.kind != "renew":
        if ApprovalRequest.objects.filter(
            run=run, action=request.action, status__in=LIVE_STATUSES
        ).exists():
            return None
        fresh = escalate(request=request, run=run, actor=actor, after=after)
        if fresh is None and after.kind == "hold":
            Run.objects.filter(pk=run.pk, version=run.version).update(status_reason=after.reason)
        return fresh
    if _renewed_once(request):
        return None
    if ApprovalRequest.objects.filter(
        run=run, action=request.action, status__in=LIVE_STATUSES
    ).exists():
        return None
    return request_raise_again(request=request, run=run, actor=actor, escalation_level=0)


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
        fresh = renew_expired(request=request, run=run, actor=actor, was=was)
        if fresh is not None or after_expiry(request=request, run=run, was=was).kind == "renew":
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
