"""Closing requests a run can never use: its version moved under an operator action, or it
was cancelled or finished. A closed request leaves the reviewers' queue and the
``cairn_approvals{state="waiting"}`` figure, which then counts only runs that wait."""

from __future__ import annotations

from approvals.models import LIVE_STATUSES, ApprovalRequest, ApprovalStatus
from checkpoints.models import ACTIVE_STATUSES, Run, RunStatus
from tenants.services import Actor, audit_record

RUN_ENDED = frozenset(RunStatus.values) - (ACTIVE_STATUSES - {RunStatus.CANCELLING})


def approval_requests_close(
    *, run: Run, reason: str, actor: Actor, status: str = ApprovalStatus.CLOSED
) -> int:
    """Close every live (pending or approved) request of ``run`` with ``status`` (closed, or
    superseded when the run will ask again) and the sentence ``reason``; one audit event
    ``approval.closed`` each. Joins the caller's transaction (call it in the one that moves
    the run). Returns how many were closed."""
    live = list(
        ApprovalRequest.objects.filter(run=run, status__in=LIVE_STATUSES).values_list(
            "pk", "status"
        )
    )
    for pk, before in live:
        changed = ApprovalRequest.objects.filter(pk=pk, status__in=LIVE_STATUSES).update(
            status=status, status_reason=reason
        )
        if changed:
            audit_record(
                tenant=run.tenant,
                actor=actor,
                action="approval.closed",
                run_id=run.pk,
                target=str(pk),
                reason=reason,
                details={"from_status": before, "status": status},
            )
    return len(live)


def approval_close_ended(*, limit: int = 500) -> int:
    """Close live requests of runs that are no longer open (cancelled, succeeded, failed,
    cancelling): the runs a worker finished without any operator action. Run by the expiry
    sweep. Returns how many were closed."""
    actor = Actor.system("approval-expiry")
    rows = list(
        ApprovalRequest.objects.filter(status__in=LIVE_STATUSES, run__status__in=RUN_ENDED)
        .select_related("run", "run__tenant")
        .order_by("created_at")[:limit]
    )
    closed = 0
    for request in rows:
        run = request.run
        closed += approval_requests_close(
            run=run,
            reason=f"The run is {run.status}; this request can no longer be used.",
            actor=actor,
        )
    return closed
