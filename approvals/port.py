"""The approvals app behind the lower layers' approvals port (``checkpoints.approvals_port``).

``port`` is what ``settings.CAIRN_APPROVALS_PORT`` names: the store's commit, the worker's
restore, operator actions and the runner's next command reach approvals through it, each
operation a thin call of the approvals service that decides.
"""

from __future__ import annotations

import logging
from typing import Any, Literal
from uuid import UUID

from django.db.models import QuerySet

from approvals.models import ApprovalRequest, ApprovalStatus
from approvals.selectors import runs_with_unused_decision
from approvals.services import approval_gate
from approvals.services.closing import approval_requests_close
from approvals.services.gate import approval_commit_check, approval_consume
from approvals.services.standing import ApprovalAsk, approval_standing
from cairn.errors import ArtifactHashMismatch
from checkpoints.approvals_port import (
    ApprovalOutcome,
    ApprovalState,
    ApprovalUse,
    AwaitedApproval,
    CommitRun,
    ConsumedApproval,
)
from checkpoints.models import Run
from checkpoints.services.workflows import approval_action
from tenants.services import Actor

log = logging.getLogger("cairn.approvals")

GATE_ACTOR = "approval gate"


def artifact_under_review(envelope: dict[str, Any], name: str | None) -> dict[str, Any] | None:
    """The evidence reference the approval state names, else the newest draft artifact."""
    refs = list((envelope.get("evidence") or {}).get("artifacts") or [])
    if name:
        return next((ref for ref in refs if ref.get("name") == name), None)
    drafts = [ref for ref in refs if ref.get("kind") == "draft"]
    return drafts[-1] if drafts else None


def restore_approval_outcome(
    *, run: Run, spec: ApprovalState, envelope: dict[str, Any]
) -> ApprovalOutcome:
    """Map the gate's verdict (``approval_gate``) to the restore's ApprovalOutcome (wait /
    approved / rejected)."""
    ref = artifact_under_review(envelope, spec.artifact)
    if ref is None:
        log.error(
            "approval state names no artifact in the evidence",
            extra={"run": str(run.pk), "state": spec.state, "artifact": spec.artifact},
        )
        return ApprovalOutcome.wait(
            f"the approval state '{spec.state}' has no artifact "
            f"'{spec.artifact or 'draft'}' in the run's evidence to review"
        )
    # The action the stored definition declares: the one the commit will hold the move to.
    action = approval_action(run.workflow.definition, spec.state)
    try:
        verdict = approval_gate(
            run=run,
            action=action,
            artifact_id=ref["id"],
            artifact_sha256=ref["sha256"],
            actor=Actor.system(GATE_ACTOR),
        )
    except ArtifactHashMismatch as exc:
        return ApprovalOutcome.wait(exc.detail)
    request = verdict.request
    control = {"approval_request_id": str(request.pk)} if request is not None else {}
    if verdict.outcome == "approved":
        approvers = ", ".join(
            d.approver.get_username()
            for d in request.decisions.select_related("approver")
            if d.decision == "approve"
        )
        validator = {
            "name": "approval",
            "passed": True,
            "detail": f"'{action}' approved by {approvers} for sha256 {request.artifact_sha256}",
        }
        evidence: dict[str, Any] = {"control": control, "validators": [validator]}
        if request.artifact_sha256 != ref["sha256"]:
            # Approved with edits: the run continues with the reviewer's edit, under the name
            # (and kind) of the artifact it replaces, so the next step reads the edited bytes.
            edited = {
                "id": str(request.artifact_id),
                "sha256": request.artifact_sha256,
                "name": ref.get("name") or spec.artifact or "draft",
            }
            if ref.get("kind"):
                edited["kind"] = ref["kind"]
            evidence["artifacts"] = [edited]
        return ApprovalOutcome("approved", evidence=evidence)
    if verdict.outcome == "rejected":
        validator = {"name": "approval", "passed": False, "detail": verdict.reason[:500]}
        return ApprovalOutcome(
            "rejected", verdict.reason, evidence={"control": control, "validators": [validator]}
        )
    return ApprovalOutcome("wait", verdict.reason, evidence={"control": control})


class ApprovalsApp:
    """The approvals app as the lower layers see it (``checkpoints.approvals_port``)."""

    def commit_approval_check(
        self,
        *,
        run: CommitRun,
        action: str,
        state: str,
        evidence: dict[str, Any],
        control: dict[str, Any],
    ) -> ApprovalUse | None:
        return approval_commit_check(
            run=run, action=action, state=state, evidence=evidence, control=control
        )

    def commit_approval_consume(self, *, use: ApprovalUse, run: CommitRun, actor: Actor) -> None:
        approval_consume(
            run=Run(pk=run.id, version=run.version, tenant_id=run.tenant_id),
            request_id=use.request_id,
            action=use.action,
            artifact_sha256=use.artifact_sha256,
            actor=actor,
        )

    def restore_approval_outcome(
        self, *, run: Run, spec: ApprovalState, envelope: dict[str, Any]
    ) -> ApprovalOutcome:
        return restore_approval_outcome(run=run, spec=spec, envelope=envelope)

    def approval_requests_close(
        self,
        *,
        run: Run,
        reason: str,
        actor: Actor,
        status: Literal["closed", "superseded"] = "closed",
    ) -> int:
        return approval_requests_close(
            run=run, reason=reason, actor=actor, status=ApprovalStatus(status)
        )

    def approved_request_id(self, *, run: Run) -> UUID | None:
        ask = ApprovalAsk(
            run_id=run.pk,
            version=run.version,
            action=approval_action(run.workflow.definition, run.state),
        )
        standing = approval_standing(ask=ask)
        return standing.request.pk if standing.verdict == "approved" else None

    def approvals_consumed(self, *, run_id: UUID) -> list[ConsumedApproval]:
        rows = ApprovalRequest.objects.filter(
            run_id=run_id, status=ApprovalStatus.CONSUMED
        ).order_by("consumed_at", "pk")
        return [
            ConsumedApproval(
                request_id=row.pk,
                action=row.action,
                artifact_sha256=row.artifact_sha256,
                checkpoint_sequence=row.checkpoint_sequence,
                checkpoint_sha256=row.checkpoint_sha256,
            )
            for row in rows
        ]

    def runs_with_unused_decision(self, *, runs: QuerySet[Run]) -> QuerySet[Run]:
        return runs_with_unused_decision(runs)

    def approval_awaited(self, *, run: Run) -> AwaitedApproval | None:
        standing = approval_standing(
            ask=ApprovalAsk(
                run_id=run.pk,
                version=run.version,
                action=approval_action(run.workflow.definition, run.state),
            )
        )
        request = standing.request
        if request is None or request.run_version != run.version:
            return None
        return AwaitedApproval(
            request_id=request.pk,
            # A pending request past its expiry is expired, whether or not the sweep marked it.
            status="expired" if standing.verdict == "expired" else request.status,
            expires_at=request.expires_at,
            decided=standing.verdict in ("approved", "used", "rejected"),
        )


port = ApprovalsApp()
