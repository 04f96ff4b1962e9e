"""Operator actions as services: resume, cancel (and its completion), grant budget."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from cairn.errors import (
    ActionNotAllowed,
    BudgetExhausted,
    ConcurrentCheckpointWrite,
    InvalidRequest,
    NotFound,
    RunNotActive,
)
from checkpoints.models import Checkpoint, OutboxMessage, RunStatus
from checkpoints.services.checkpoints import CommitRequest, checkpoint_commit
from runtime.services.actions import run_grant_budget, run_resume
from runtime.services.cancel import run_cancel, runs_cancel_sweep
from runtime.services.cancel_finish import run_cancel_complete
from tenants.services import Actor
from tests.actions_support import advance, audit_events, operation, resume_messages, worker_run

pytestmark = pytest.mark.django_db


@pytest.fixture
def wrun(acme, bob):  # noqa: ANN001
    return worker_run(acme, bob)


def as_bob(bob):  # noqa: ANN001, ANN201
    return Actor(user=bob)


# --- resume ------------------------------------------------------------------------------
def test_resume_moves_a_paused_run_to_running_and_enqueues_the_command(wrun, bob):
    paused = advance(wrun, bob, "draft_answer", status="paused_for_review")
    run = run_resume(
        tenant=paused.tenant,
        run_id=paused.id,
        expected_version=paused.version,
        reason="the new code has the step again",
        actor=as_bob(bob),
    )
    assert (run.status, run.version) == (RunStatus.RUNNING, paused.version + 1)
    assert resume_messages(run)[-1] == {"run_id": str(run.id), "expected_version": run.version}
    (event,) = audit_events(run, "run.resume")
    assert (event.actor, event.reason) == (bob, "the new code has the step again")
    assert event.details["from_status"] == "paused_for_review"


def test_resume_refuses_a_stale_version_and_changes_nothing(wrun, bob):
    paused = advance(wrun, bob, "draft_answer", status="paused_for_review")
    outbox_before = OutboxMessage.objects.count()
    with pytest.raises(ConcurrentCheckpointWrite) as caught:
        run_resume(
            tenant=paused.tenant,
            run_id=paused.id,
            expected_version=paused.version - 1,
            reason="",
            actor=as_bob(bob),
        )
    assert "changed since you loaded it" in caught.value.detail
    paused.refresh_from_db()
    assert paused.status == RunStatus.PAUSED_FOR_REVIEW
    assert OutboxMessage.objects.count() == outbox_before
    assert not audit_events(paused, "run.resume")


@pytest.mark.parametrize("status", ["succeeded", "cancelled"])
def test_resume_refuses_a_finished_run(wrun, bob, status):  # noqa: ANN001
    if status == "succeeded":
        run = wrun
        for state in ("draft_answer", "review", "publish", "done"):
            run = advance(run, bob, state)
        assert run.status == "succeeded"
    else:
        run = run_cancel(tenant=wrun.tenant, run_id=wrun.id, reason="stop", actor=as_bob(bob))
    with pytest.raises(RunNotActive):
        run_resume(
            tenant=run.tenant, run_id=run.id, expected_version=run.version, actor=as_bob(bob)
        )


def test_resume_refuses_a_run_that_is_already_running(wrun, bob):
    with pytest.raises(ActionNotAllowed) as caught:
        run_resume(
            tenant=wrun.tenant, run_id=wrun.id, expected_version=wrun.version, actor=as_bob(bob)
        )
    assert "already running" in caught.value.detail


def test_resume_of_another_tenants_run_is_not_found(wrun, globex, charlie):
    with pytest.raises(NotFound):
        run_resume(tenant=globex, run_id=wrun.id, expected_version=1, actor=Actor(user=charlie))


def test_a_run_failed_for_its_budget_resumes_only_after_a_grant(acme, bob):
    run = worker_run(acme, bob, budget={"max_attempts": 2})
    failed = advance(
        run,
        bob,
        "collect_sources",
        envelope={"budgets": {"attempts_used": 2}},
        status="failed",
        status_reason="budget exhausted: attempts used 2 of 2",
    )
    with pytest.raises(BudgetExhausted) as caught:
        run_resume(
            tenant=acme, run_id=failed.id, expected_version=failed.version, actor=as_bob(bob)
        )
    assert "attempts used 2 of 2" in caught.value.detail
    granted = run_grant_budget(
        tenant=acme,
        run_id=failed.id,
        attempts=3,
        reason="the source site was down",
        expected_version=failed.version,
        actor=as_bob(bob),
    )
    # A grant adds budget but does not restart anything by itself.
    assert granted.status == RunStatus.FAILED
    assert granted.budget_limits["max_attempts"] == 5
    assert granted.budget_used["attempts_used"] == 2
    resumed = run_resume(
        tenant=acme, run_id=failed.id, expected_version=granted.version, actor=as_bob(bob)
    )
    assert resumed.status == RunStatus.RUNNING
    (event,) = audit_events(resumed, "run.budget_grant")
    assert event.reason == "the source site was down"
    assert event.details["granted"] == {"attempts": 3}
    assert event.details["limits_before"]["max_attempts"] == 2


# --- cancel ------------------------------------------------------------------------------
def test_cancel_without_open_operations_cancels_at_once(wrun, bob):
    run = run_cancel(tenant=wrun.tenant, run_id=wrun.id, reason="wrong question", actor=as_bob(bob))
    assert (run.status, run.version) == (RunStatus.CANCELLED, wrun.version + 1)
    assert "wrong question" in run.status_reason
    (event,) = audit_events(run, "run.cancel")
    assert event.reason == "wrong question" and event.details["status"] == "cancelled"
    # History is kept, and a worker holding the old command can no longer write.
    assert Checkpoint.objects.filter(run=run).count() == 1
    with pytest.raises(RunNotActive):
        checkpoint_commit(
            tenant=run.tenant,
            run_id=run.id,
            request=CommitRequest(
                expected_version=run.version, state="draft_answer", envelope={}, actor=as_bob(bob)
            ),
        )


def test_cancel_waits_for_open_operations_to_be_settled(wrun, bob):
    op = operation(wrun, "publish-1", "pending")
    operation(wrun, "publish-0", "confirmed")
    run = run_cancel(tenant=wrun.tenant, run_id=wrun.id, reason="stop", actor=as_bob(bob))
    assert run.status == RunStatus.CANCELLING
    assert audit_events(run, "run.cancel")[0].details["open_operations"] == ["publish-1"]
    assert OutboxMessage.objects.filter(run=run, kind="run.cancel_requested").exists()
    reconciler = Actor.system("reconciler")
    assert run_cancel_complete(tenant=run.tenant, run_id=run.id, actor=reconciler) is False
    op.status = "confirmed"
    op.save()
    assert run_cancel_complete(tenant=run.tenant, run_id=run.id, actor=reconciler) is True
    run.refresh_from_db()
    assert (run.status, run.version) == (RunStatus.CANCELLED, wrun.version + 2)
    (done,) = audit_events(run, "run.cancel_completed")
    assert done.details["operations"] == {"publish-0": "confirmed", "publish-1": "confirmed"}
    # Idempotent: a second settlement call does nothing.
    assert run_cancel_complete(tenant=run.tenant, run_id=run.id, actor=reconciler) is False


def test_the_sweep_completes_cancels_whose_operations_are_settled(acme, bob):
    settled, still_open = worker_run(acme, bob), worker_run(acme, bob)
    op = operation(settled, "a", "unknown")
    operation(still_open, "b", "pending")
    for run in (settled, still_open):
        run_cancel(tenant=acme, run_id=run.id, reason="stop", actor=as_bob(bob))
    op.status = "failed"
    op.save()
    assert runs_cancel_sweep() == 1
    settled.refresh_from_db()
    still_open.refresh_from_db()
    assert (settled.status, still_open.status) == (RunStatus.CANCELLED, RunStatus.CANCELLING)


def test_cancel_needs_a_reason(wrun, bob):
    with pytest.raises(InvalidRequest) as caught:
        run_cancel(tenant=wrun.tenant, run_id=wrun.id, reason="  ", actor=as_bob(bob))
    assert caught.value.fields == {"reason": "required"}
    wrun.refresh_from_db()
    assert wrun.status == RunStatus.RUNNING


def test_cancel_refuses_a_stale_version(wrun, bob):
    with pytest.raises(ConcurrentCheckpointWrite):
        run_cancel(
            tenant=wrun.tenant,
            run_id=wrun.id,
            reason="stop",
            expected_version=wrun.version + 1,
            actor=as_bob(bob),
        )
    assert not audit_events(wrun, "run.cancel")


def test_cancel_refuses_a_finished_or_cancelling_run(wrun, bob):
    operation(wrun, "k", "pending")
    run_cancel(tenant=wrun.tenant, run_id=wrun.id, reason="stop", actor=as_bob(bob))
    with pytest.raises(RunNotActive) as caught:
        run_cancel(tenant=wrun.tenant, run_id=wrun.id, reason="again", actor=as_bob(bob))
    assert "already being cancelled" in caught.value.detail


# --- grant budget ------------------------------------------------------------------------
def test_grant_refuses_an_unlimited_budget_and_an_empty_grant(wrun, bob):
    with pytest.raises(ActionNotAllowed):
        run_grant_budget(
            tenant=wrun.tenant, run_id=wrun.id, tokens=10, reason="more", actor=as_bob(bob)
        )
    with pytest.raises(InvalidRequest):
        run_grant_budget(tenant=wrun.tenant, run_id=wrun.id, reason="more", actor=as_bob(bob))
    with pytest.raises(InvalidRequest):
        run_grant_budget(
            tenant=wrun.tenant, run_id=wrun.id, attempts=0, reason="more", actor=as_bob(bob)
        )
    wrun.refresh_from_db()
    assert wrun.version == 1


def test_grant_to_a_running_run_reissues_its_command_for_the_new_version(acme, bob):
    run = worker_run(acme, bob, budget={"max_tokens": 100, "max_cost": 1.5})
    run = run_grant_budget(
        tenant=acme, run_id=run.id, tokens=50, cost=0.5, reason="long doc", actor=as_bob(bob)
    )
    assert run.budget_limits["max_tokens"] == 150 and run.budget_limits["max_cost"] == 2.0
    assert resume_messages(run)[-1]["expected_version"] == run.version == 2


def test_grant_extends_the_deadline_only_to_a_later_time(acme, bob):
    soon = timezone.now() + timedelta(minutes=5)
    run = worker_run(acme, bob, budget={"deadline": soon.isoformat()})
    with pytest.raises(ActionNotAllowed):
        run_grant_budget(
            tenant=acme,
            run_id=run.id,
            deadline=soon - timedelta(minutes=1),
            reason="x",
            actor=as_bob(bob),
        )
    later = soon + timedelta(hours=1)
    run = run_grant_budget(
        tenant=acme, run_id=run.id, deadline=later, reason="x", actor=as_bob(bob)
    )
    assert run.budget_limits["deadline"] == later.isoformat()


def test_grant_refuses_a_run_waiting_for_approval(wrun, bob):
    waiting = advance(advance(wrun, bob, "draft_answer"), bob, "review")
    assert waiting.status == RunStatus.WAITING_APPROVAL
    with pytest.raises(ActionNotAllowed) as caught:
        run_grant_budget(
            tenant=wrun.tenant, run_id=wrun.id, attempts=1, reason="x", actor=as_bob(bob)
        )
    assert "approval" in caught.value.detail


def test_grant_refuses_a_stale_version(acme, bob):
    run = worker_run(acme, bob, budget={"max_attempts": 2})
    with pytest.raises(ConcurrentCheckpointWrite):
        run_grant_budget(
            tenant=acme,
            run_id=run.id,
            attempts=1,
            reason="x",
            expected_version=7,
            actor=as_bob(bob),
        )
    run.refresh_from_db()
    assert run.budget_limits["max_attempts"] == 2
