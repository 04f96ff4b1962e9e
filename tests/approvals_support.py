"""Helpers for the approvals tests: drafts, moving a run to its approval state, asking."""

from __future__ import annotations

import copy
from datetime import timedelta

from django.utils import timezone

from approvals.models import ApprovalDecision, ApprovalRequest
from approvals.notify import notification_deliver, notifications_plan
from approvals.services import approval_decide, approval_request_create
from checkpoints.models import Artifact, OutboxMessage, Run
from checkpoints.services.artifacts import artifact_store
from checkpoints.services.checkpoints import CommitRequest, checkpoint_commit
from checkpoints.services.workflows import workflow_register
from runtime.services.runs import run_create
from tenants.models import Tenant
from tenants.reviewer_groups import reviewer_group_create, reviewer_group_member_add
from tenants.services import Actor
from tests.factories import SIMPLE_DEFINITION
from tests.protocol_support import approved_evidence, leaves_approval

DRAFT = "# Cairns\n\nHikers build cairns to mark a route.\n\n- above the tree line\n"


def draft(tenant: Tenant, text: str = DRAFT, media_type: str = "text/markdown") -> Artifact:
    artifact, _ = artifact_store(
        tenant=tenant, data=text.encode(), media_type=media_type, kind="draft"
    )
    return artifact


def move(run: Run, state: str, artifact: Artifact | None = None) -> Run:
    """Commit the run's next checkpoint into ``state`` (naming the draft as evidence)."""
    run.refresh_from_db()
    groups = {}
    if artifact is not None:
        groups["evidence"] = {
            "artifacts": [{"id": str(artifact.id), "sha256": artifact.sha256, "name": "draft"}],
            "validators": [],
        }
    if leaves_approval(run, state, None):
        # Every writer leaves an approval state with a granted approval (issue 15).
        groups["evidence"] = approved_evidence(run, groups.get("evidence"))
    checkpoint_commit(
        tenant=run.tenant,
        run_id=run.id,
        request=CommitRequest(
            expected_version=run.version,
            state=state,
            step=state,
            envelope=groups,
            actor=Actor.system("test driver"),
        ),
    )
    run.refresh_from_db()
    return run


def at_review(run: Run, artifact: Artifact) -> Run:
    """collect_sources → draft_answer → review (the approval state: waiting_approval)."""
    move(run, "draft_answer", artifact)
    return move(run, "review", artifact)


def ask(run: Run, artifact: Artifact, user, **kwargs) -> ApprovalRequest:  # noqa: ANN001
    run.refresh_from_db()
    return approval_request_create(
        tenant=run.tenant,
        run_id=run.id,
        artifact_id=artifact.id,
        artifact_sha256=artifact.sha256,
        action=kwargs.pop("action", "publish"),
        actor=Actor(user=user),
        **kwargs,
    )


def expire_now(request: ApprovalRequest) -> None:
    """Move the request's expiry into the past (as if its time ran out)."""
    ApprovalRequest.objects.filter(pk=request.pk).update(
        expires_at=timezone.now() - timedelta(seconds=1)
    )


def worker_run(tenant: Tenant, user) -> Run:  # noqa: ANN001
    """A run Cairn's workers would drive (a code workflow), for outbox assertions."""
    workflow_register(
        tenant=tenant,
        workflow_type="approvals-test",
        version="1",
        definition=SIMPLE_DEFINITION,
        has_code=True,
    )
    return run_create(
        tenant=tenant,
        workflow_type="approvals-test",
        inputs={},
        execution="worker",
        actor=Actor(user=user),
    )


def start_demo(tenant: Tenant, user) -> Run:  # noqa: ANN001
    """A run of the demo ``research`` workflow (Python steps: worker execution), started by
    ``user`` with a budget that lasts the whole story."""
    return run_create(
        tenant=tenant,
        workflow_type="research",
        inputs={"question": "Why do hikers build cairns?"},
        budget={"max_attempts": 20, "max_tokens": 100000, "max_cost": 10.0},
        actor=Actor(user=user),
    )


def decide(
    request: ApprovalRequest,
    user,  # noqa: ANN001
    decision: str = "approve",
    sha: str | None = None,
    comment: str = "",
) -> ApprovalDecision:
    """``user`` decides ``request``, on the bound sha256 unless told another."""
    return approval_decide(
        tenant=request.tenant,
        request_id=request.pk,
        decision=decision,
        artifact_sha256=request.artifact_sha256 if sha is None else sha,
        comment=comment,
        actor=Actor(user=user),
    )


def deliver_all() -> dict[str, int]:
    """What the dispatcher and a worker do with the outbox's notification messages: run each
    unsent one's task (due or not: a retry's delay is not waited for), mark it sent."""
    done = {"planned": 0, "sent": 0, "failed": 0, "skipped": 0}
    while True:
        due = list(
            OutboxMessage.objects.filter(
                kind__in=("approval.notify", "approval.deliver"), sent_at__isnull=True
            ).order_by("id")
        )
        if not due:
            return done
        for message in due:
            OutboxMessage.objects.filter(pk=message.pk).update(sent_at=message.created_at)
            if message.kind == "approval.notify":
                done["planned"] += notifications_plan(**message.payload)
            else:
                done[notification_deliver(**message.payload)] += 1


def legal_quorum_request(tenant: Tenant, admin, starter, members) -> ApprovalRequest:  # noqa: ANN001
    """A quorum-2 request for the reviewer group 'legal' (``members``, created by ``admin``)
    on an externally driven run ``starter`` started, who also asked for the approval."""
    reviewer_group_create(tenant=tenant, name="legal", actor=Actor(user=admin))
    for user in members:
        reviewer_group_member_add(
            tenant=tenant, name="legal", username=user.username, actor=Actor(user=admin)
        )
    return legal_request(tenant, starter, starter)


def legal_request(tenant: Tenant, starter, asker) -> ApprovalRequest:  # noqa: ANN001
    """A quorum-2 request for the reviewer group 'legal' (which must exist) on an
    externally driven run ``starter`` started, asked for by ``asker``."""
    definition = copy.deepcopy(SIMPLE_DEFINITION)
    definition["approvals"] = {
        "review": {"action": "publish", "reviewers": {"group": "legal"}, "quorum": 2}
    }
    workflow_register(tenant=tenant, workflow_type="legal", version="1", definition=definition)
    run = run_create(
        tenant=tenant,
        workflow_type="legal",
        inputs={},
        execution="external",
        actor=Actor(user=starter),
    )
    artifact = draft(tenant)
    return ask(at_review(run, artifact), artifact, asker)
