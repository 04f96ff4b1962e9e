"""What a test writer needs to leave an approval state the way every writer must (issues 15, 24):
an approval request bound to the run's version, decided by a reviewer through the services.
"""

from __future__ import annotations

from typing import Any

from approvals.services import approval_decide, approval_request_create
from checkpoints.models import Run
from checkpoints.services.artifacts import artifact_store
from tenants.services import Actor, member_set_role
from tests.factories import UserFactory


def _reviewer(run: Run):  # noqa: ANN202
    from django.contrib.auth import get_user_model

    user = get_user_model().objects.filter(username="protocol-reviewer").first()
    if user is None:
        user = UserFactory(username="protocol-reviewer")
    member_set_role(tenant=run.tenant, user=user, role="reviewer", actor=Actor.system("test"))
    return user


def leaves_approval(run: Run, state: str, status: str | None) -> bool:
    """Whether a commit of ``run`` into ``state`` passes an approval state, so needs a
    granted approval, by the rule every writer is held to (issue 24: any status)."""
    from cairn.errors import ApprovalRequired
    from checkpoints.services.commit_rules import approval_to_pass

    try:
        gate = approval_to_pass(run, run.workflow.definition, state, status or "running")
    except ApprovalRequired:
        return False  # no approval lets this commit through; the test sees the refusal
    return gate is not None


def approved_evidence(run: Run, evidence: dict[str, Any] | None = None) -> dict[str, Any]:
    """Approve a draft for the run's current version; return the evidence group naming it
    (``evidence`` extended, or a fresh one)."""
    run.refresh_from_db()
    artifact, _ = artifact_store(
        tenant=run.tenant,
        data=f"draft for {run.pk} at version {run.version}".encode(),
        media_type="text/plain",
        kind="draft",
    )
    request = approval_request_create(
        tenant=run.tenant,
        run_id=run.id,
        artifact_id=artifact.id,
        artifact_sha256=artifact.sha256,
        action="publish",
        actor=Actor.system("test runner"),
    )
    approval_decide(
        tenant=run.tenant,
        request_id=request.pk,
        decision="approve",
        artifact_sha256=artifact.sha256,
        actor=Actor(user=_reviewer(run)),
    )
    evidence = dict(evidence or {"artifacts": [], "validators": []})
    evidence["artifacts"] = [
        *evidence.get("artifacts", []),
        {"id": str(artifact.id), "sha256": artifact.sha256, "name": "approved-draft"},
    ]
    return evidence
