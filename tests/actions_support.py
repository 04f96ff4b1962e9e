"""Helpers for the operator-action tests: runs moved through the real services."""

from __future__ import annotations

from typing import Any

from checkpoints.models import ExternalOperation, OutboxMessage, Run
from checkpoints.services.checkpoints import CommitRequest, checkpoint_commit
from checkpoints.services.workflows import workflow_register
from runtime.services.runs import run_create
from tenants.models import AuditEvent
from tenants.services import Actor
from tests.protocol_support import approved_evidence, leaves_approval

# A workflow with Python steps (as runtime registers it): steps map state → step.
CODED_DEFINITION = {
    "initial": "collect_sources",
    "states": ["collect_sources", "draft_answer", "review", "publish", "done"],
    "transitions": [
        ["collect_sources", "draft_answer"],
        ["draft_answer", "review"],
        ["review", "publish"],
        ["publish", "done"],
    ],
    "terminal": ["done"],
    "approval_states": ["review"],
    "effect_states": ["publish"],
    "steps": {
        "collect_sources": "collect",
        "draft_answer": "draft",
        "publish": "publish_answer",
    },
}


def worker_run(tenant, user, *, budget: dict | None = None, inputs: dict | None = None) -> Run:  # noqa: ANN001
    workflow_register(
        tenant=tenant,
        workflow_type="coded",
        version="1",
        definition=CODED_DEFINITION,
        has_code=True,
    )
    return run_create(
        tenant=tenant,
        workflow_type="coded",
        inputs=inputs if inputs is not None else {"question": "why?", "lang": "en"},
        budget=budget,
        execution="worker",
        actor=Actor(user=user),
    )


def advance(run: Run, user, state: str, **kwargs: Any) -> Run:  # noqa: ANN001
    """Commit the run's next checkpoint into ``state`` (as a worker would) and reload it."""
    run.refresh_from_db()
    params: dict[str, Any] = {"step": state, "envelope": {}}
    params.update(kwargs)
    if leaves_approval(run, state, params.get("status")):
        # Every writer leaves an approval state with a granted approval (issue 15).
        envelope = dict(params["envelope"])
        envelope["evidence"] = approved_evidence(run, envelope.get("evidence"))
        params["envelope"] = envelope
    checkpoint_commit(
        tenant=run.tenant,
        run_id=run.id,
        request=CommitRequest(
            expected_version=run.version, state=state, actor=Actor(user=user), **params
        ),
    )
    run.refresh_from_db()
    return run


def operation(run: Run, key: str, status: str, action: str = "publish") -> ExternalOperation:
    return ExternalOperation.objects.create(
        tenant=run.tenant,
        run=run,
        step="publish",
        idempotency_key=key,
        action=action,
        target="https://example.org/answers",
        request_fingerprint="f" * 64,
        status=status,
        provider_operation_id="prov-1" if status == "confirmed" else "",
    )


def audit_events(run: Run, action: str) -> list[AuditEvent]:
    return list(AuditEvent.objects.filter(run_id=run.id, action=action).order_by("id"))


def resume_messages(run: Run) -> list[dict]:
    return list(
        OutboxMessage.objects.filter(run=run, kind="run.resume")
        .order_by("id")
        .values_list("payload", flat=True)
    )
