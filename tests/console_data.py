"""Test data for the console pages, made through the real services."""

from __future__ import annotations

from datetime import timedelta

from django.utils import timezone

from checkpoints.models import ExternalOperation, OperationStatus, Run
from checkpoints.services.artifacts import artifact_store
from checkpoints.services.checkpoints import CommitRequest, checkpoint_commit
from runtime.services.runs import run_create
from tenants.models import Tenant
from tenants.services import Actor

DRAFT_TEXT = "<script>alert('draft')</script>\nThe answer is 42."


def story_run(tenant: Tenant, user, *, objective: str = "ticket-1", stalled: bool = True) -> Run:  # noqa: ANN001
    """A run that collected sources, drafted an answer (an artifact, validators) and is
    waiting for review, with a side effect pending long enough to count as stalled."""
    actor = Actor(user=user)
    run = run_create(
        tenant=tenant,
        workflow_type="research",
        inputs={"question": "why?"},
        objective_ref=objective,
        budget={"max_attempts": 5, "max_tokens": 1000},
        execution="external",
        actor=actor,
    )
    draft, _ = artifact_store(
        tenant=tenant, data=DRAFT_TEXT.encode(), media_type="text/plain", kind="draft"
    )
    checkpoint_commit(
        tenant=tenant,
        run_id=run.pk,
        request=CommitRequest(
            expected_version=1,
            state="draft_answer",
            step="write_draft",
            envelope={"budgets": {"attempts_used": 1, "tokens_used": 250}},
            actor=actor,
        ),
    )
    checkpoint_commit(
        tenant=tenant,
        run_id=run.pk,
        request=CommitRequest(
            expected_version=2,
            state="review",
            step="ask_review",
            envelope={
                "evidence": {
                    "artifacts": [
                        {"id": str(draft.pk), "sha256": draft.sha256, "name": "draft.txt"}
                    ],
                    "validators": [
                        {"name": "cites_sources", "passed": True},
                        {"name": "under_500_words", "passed": False},
                    ],
                },
                "budgets": {"attempts_used": 2, "tokens_used": 600},
            },
            actor=actor,
        ),
    )
    operation = ExternalOperation.objects.create(
        tenant=tenant,
        run=run,
        step="publish",
        idempotency_key=f"publish-{run.pk}",
        action="publish",
        target="https://example.org/posts",
        request_fingerprint="f" * 64,
        provider="blog",
        status=OperationStatus.PENDING,
        provider_operation_id="prov-123",
    )
    if stalled:
        ExternalOperation.objects.filter(pk=operation.pk).update(
            created_at=timezone.now() - timedelta(hours=2),
            updated_at=timezone.now() - timedelta(hours=2),
        )
    run.refresh_from_db()
    return run


def plain_run(tenant: Tenant, user, *, objective: str = "") -> Run:  # noqa: ANN001
    return run_create(
        tenant=tenant,
        workflow_type="research",
        inputs={"n": 1},
        objective_ref=objective,
        execution="external",
        actor=Actor(user=user),
    )
