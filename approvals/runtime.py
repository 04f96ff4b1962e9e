"""The approvals side of the runtime's approval hook (``runtime.hooks``).

The worker calls it on every restore of a run at an approval state; it answers with the
runtime's ApprovalOutcome, deciding through ``approvals.services.approval_gate``.
"""

from __future__ import annotations

import logging
from typing import Any

from approvals.services import approval_gate
from cairn.errors import ArtifactHashMismatch
from checkpoints.models import Run
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


def runtime_approval_outcome(*, run: Run, spec: Any, envelope: dict[str, Any]) -> Any:
    """Map the gate's verdict to the runtime's ApprovalOutcome (wait / approved / rejected)."""
    from runtime.hooks import ApprovalOutcome

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
    try:
        verdict = approval_gate(
            run=run,
            action=spec.action,
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
            "detail": f"'{spec.action}' approved by {approvers} for sha256 "
            f"{request.artifact_sha256}",
        }
        return ApprovalOutcome("approved", evidence={"control": control, "validators": [validator]})
    if verdict.outcome == "rejected":
        validator = {"name": "approval", "passed": False, "detail": verdict.reason[:500]}
        return ApprovalOutcome(
            "rejected", verdict.reason, evidence={"control": control, "validators": [validator]}
        )
    return ApprovalOutcome("wait", verdict.reason, evidence={"control": control})
