"""Operator actions meet the workflow runtime: the demo research workflow, executed by the
runtime's own ``run_advance`` (the body of the Celery task), continues correctly after a
retry, a fork and a resume."""

from __future__ import annotations

from typing import Any

import pytest

from cairn.errors import CairnError
from checkpoints.models import Checkpoint, OutboxMessage, Run, RunStatus
from checkpoints.services.integrity import run_verify
from runtime import Workflow
from runtime.executor import run_advance
from runtime.registry import workflow_ensure_registered
from runtime.services.actions import run_grant_budget, run_resume
from runtime.services.forks import run_fork
from runtime.services.retry import run_retry
from runtime.services.runs import run_create
from tenants.models import AuditEvent
from tenants.services import Actor

pytestmark = pytest.mark.django_db


def drive(run: Run, limit: int = 20) -> Run:
    """Deliver the run's pending ``run.resume`` commands, as workers would, until none is
    left that applies."""
    for _ in range(limit):
        run.refresh_from_db()
        message = (
            OutboxMessage.objects.filter(run=run, kind="run.resume", sent_at__isnull=True)
            .order_by("-id")
            .first()
        )
        if message is None or run.status != RunStatus.RUNNING:
            break
        OutboxMessage.objects.filter(run=run, sent_at__isnull=True).update(
            sent_at=message.created_at
        )
        run_advance(run_id=run.id, expected_version=message.payload["expected_version"], owner="t")
    run.refresh_from_db()
    return run


@pytest.fixture
def waiting(acme, bob, settings):  # noqa: ANN001
    settings.CAIRN_DISPATCH_ON_COMMIT = False
    assert workflow_ensure_registered("research", "1")
    run = run_create(
        tenant=acme,
        workflow_type="research",
        workflow_version="1",
        inputs={"question": "How do cairns help navigation above the tree line?"},
        execution="worker",
        actor=Actor(user=bob),
    )
    run = drive(run)
    assert (run.status, run.state) == (RunStatus.WAITING_APPROVAL, "request_approval")
    return run


def states(run: Run) -> list[str]:
    return list(
        Checkpoint.objects.filter(run=run).order_by("sequence").values_list("state", flat=True)
    )


def test_a_retried_step_runs_again_and_the_run_comes_back_to_its_approval(waiting, bob):
    before = states(waiting)
    run = run_retry(
        tenant=waiting.tenant,
        run_id=waiting.id,
        step="draft_answer",
        reason="redraft",
        actor=Actor(user=bob),
    )
    run = drive(run)
    assert (run.status, run.state) == (RunStatus.WAITING_APPROVAL, "request_approval")
    after = states(run)
    assert after[: len(before)] == before
    assert after[len(before) :] == ["draft_answer", "validate_citations", "request_approval"]
    assert run_verify(tenant=run.tenant, run_id=run.id)["ok"]


def test_a_fork_from_an_older_checkpoint_runs_on_from_there(waiting, bob):
    second = Checkpoint.objects.get(run=waiting, sequence=2)
    result = run_fork(
        tenant=waiting.tenant,
        run_id=waiting.id,
        from_sequence=2,
        inputs_patch={"question": "What harm can building cairns do to a stream?"},
        reason="ask the other question",
        actor=Actor(user=bob),
    )
    fork = drive(result.run)
    assert (fork.status, fork.state) == (RunStatus.WAITING_APPROVAL, "request_approval")
    assert states(fork)[0] == second.state
    assert run_verify(tenant=fork.tenant, run_id=fork.id)["ok"]
    waiting.refresh_from_db()
    assert waiting.status == RunStatus.WAITING_APPROVAL  # the source did not move


def test_a_paused_run_resumes_from_its_latest_checkpoint(waiting, bob):
    run = run_retry(
        tenant=waiting.tenant,
        run_id=waiting.id,
        step="extract_claims",
        reason="x",
        actor=Actor(user=bob),
    )
    Run.objects.filter(pk=run.pk).update(status=RunStatus.PAUSED_FOR_REVIEW)
    run.refresh_from_db()
    run = run_resume(
        tenant=run.tenant, run_id=run.id, expected_version=run.version, actor=Actor(user=bob)
    )
    run = drive(run)
    assert (run.status, run.state) == (RunStatus.WAITING_APPROVAL, "request_approval")


# A step with one paid model call, during which an operator grants budget (the step itself
# calls the service, so the grant lands exactly while the worker executes the step).
metered = Workflow("metered", version="1")
during_step: dict[str, Any] = {}


@metered.step("summarize", next="done")
def summarize(ctx):  # noqa: ANN001, ANN201
    during_step["model_calls"] = during_step.get("model_calls", 0) + 1
    ctx.model.complete(prompt="summarize the cairn survey")
    try:
        run_grant_budget(
            tenant=ctx.tenant,
            run_id=ctx.run_id,
            tokens=1000,
            reason="the survey is long",
            actor=during_step["operator"],
        )
        during_step["grant"] = "granted"
    except CairnError as exc:
        during_step["grant"] = exc
    return {"summary": "cairns mark the way"}


metered.terminal("done")


def test_a_grant_while_a_worker_runs_a_step_is_refused_so_the_paid_call_is_not_repeated(
    acme, bob, settings
):
    settings.CAIRN_DISPATCH_ON_COMMIT = False
    during_step.clear()
    during_step["operator"] = Actor(user=bob)
    run = run_create(
        tenant=acme,
        workflow_type="metered",
        inputs={},
        budget={"max_tokens": 5000},
        execution="worker",
        actor=Actor(user=bob),
    )
    run = drive(run)
    assert run.status == RunStatus.SUCCEEDED, run.status_reason
    assert during_step["model_calls"] == 1
    refusal = during_step["grant"]
    assert isinstance(refusal, CairnError), refusal
    assert (refusal.code, refusal.status) == ("lease_held", 409)
    assert "A worker is running this run right now" in refusal.detail
    assert "grant again when it pauses, waits or fails" in refusal.detail
    assert run.budget_limits["max_tokens"] == 5000
    assert not AuditEvent.objects.filter(run_id=run.id, action="run.budget_grant").exists()
