"""The server enforces the protocol for every writer: a commit over HTTP is checked against
the run's stored workflow definition, and a refusal writes nothing. Each of these commits
answered 201 before (issue 15)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from approvals.models import ApprovalRequest, ApprovalStatus
from cairn.errors import ApprovalRequired
from checkpoints.models import Checkpoint, Run
from checkpoints.services.checkpoints import CommitRequest, checkpoint_commit
from tenants.services import Actor
from tests.approvals_support import DRAFT, ask, at_review, decide, draft

pytestmark = pytest.mark.django_db


@pytest.fixture
def as_bob(api_as, bob, acme):  # noqa: ANN001, ANN201
    return api_as(bob, acme)


def _evidence(artifact) -> dict:  # noqa: ANN001
    return {
        "artifacts": [{"id": str(artifact.id), "sha256": artifact.sha256, "name": "draft"}],
        "validators": [],
    }


def _commit(client, run: Run, state: str, **body):  # noqa: ANN001, ANN003, ANN202
    run.refresh_from_db()
    payload = {"expected_version": run.version, "state": state, "step": state, "envelope": {}}
    payload.update(body)
    return client.post(f"/api/v1/runs/{run.id}/checkpoints", payload, format="json")


def _refused(response, status: int, code: str, run: Run) -> None:  # noqa: ANN001
    assert response.status_code == status, response.json()
    assert response.json()["code"] == code
    before = (run.version, run.checkpoint_sequence, run.state, run.status)
    run.refresh_from_db()
    assert (run.version, run.checkpoint_sequence, run.state, run.status) == before
    assert Checkpoint.objects.filter(run=run).count() == run.checkpoint_sequence


# --- leaving an approval state -------------------------------------------------------------
def test_leaving_an_approval_state_without_any_approval_is_refused(run, as_bob, acme):  # noqa: ANN001
    artifact = draft(acme)
    run = at_review(run, artifact)
    answer = _commit(as_bob, run, "publish", envelope={"evidence": _evidence(artifact)})
    _refused(answer, 409, "approval_required", run)
    assert "POST /runs/" in answer.json()["detail"]


def test_leaving_while_the_request_is_still_pending_is_refused(run, as_bob, bob, acme):  # noqa: ANN001
    artifact = draft(acme)
    run = at_review(run, artifact)
    request = ask(run, artifact, bob)
    answer = _commit(as_bob, run, "publish", envelope={"evidence": _evidence(artifact)})
    _refused(answer, 409, "approval_required", run)
    assert str(request.pk) in answer.json()["detail"]


def test_a_granted_approval_is_consumed_once_by_the_commit_that_leaves(
    run, as_bob, bob, carol, acme
):  # noqa: ANN001
    artifact = draft(acme)
    run = at_review(run, artifact)
    request = ask(run, artifact, bob)
    decide(request, carol)
    answer = _commit(
        as_bob,
        run,
        "publish",
        envelope={
            "evidence": _evidence(artifact),
            "control": {"approval_request_id": str(request.pk)},
        },
    )
    assert answer.status_code == 201, answer.json()
    request.refresh_from_db()
    assert request.status == ApprovalStatus.CONSUMED
    run.refresh_from_db()
    assert run.state == "publish"


def test_an_approval_for_another_artifact_than_the_committed_evidence_is_refused(
    run, as_bob, bob, carol, acme
):  # noqa: ANN001
    artifact = draft(acme)
    run = at_review(run, artifact)
    decide(ask(run, artifact, bob), carol)
    swapped = draft(acme, DRAFT + "\nA sentence nobody reviewed.\n")
    answer = _commit(as_bob, run, "publish", envelope={"evidence": _evidence(swapped)})
    _refused(answer, 409, "artifact_hash_mismatch", run)
    assert ApprovalRequest.objects.get(run=run).status == ApprovalStatus.APPROVED  # not used


def test_an_expired_approval_is_refused(run, as_bob, bob, carol, acme):  # noqa: ANN001
    artifact = draft(acme)
    run = at_review(run, artifact)
    request = ask(run, artifact, bob)
    decide(request, carol)
    ApprovalRequest.objects.filter(pk=request.pk).update(
        expires_at=timezone.now() - timedelta(seconds=1)
    )
    answer = _commit(as_bob, run, "publish", envelope={"evidence": _evidence(artifact)})
    _refused(answer, 409, "approval_expired", run)


def test_an_approval_bound_to_an_earlier_run_version_is_refused(run, as_bob, bob, carol, acme):  # noqa: ANN001
    artifact = draft(acme)
    run = at_review(run, artifact)
    decide(ask(run, artifact, bob), carol)
    # Progress within the approval state moves the version past the one approved.
    staying = _commit(as_bob, run, "review", envelope={"evidence": _evidence(artifact)})
    assert staying.status_code == 201
    answer = _commit(as_bob, run, "publish", envelope={"evidence": _evidence(artifact)})
    _refused(answer, 409, "approval_stale", run)


def test_cairns_own_writers_are_held_to_the_same_rule(run, acme):  # noqa: ANN001
    artifact = draft(acme)
    run = at_review(run, artifact)
    with pytest.raises(ApprovalRequired):
        checkpoint_commit(
            tenant=acme,
            run_id=run.id,
            request=CommitRequest(
                expected_version=run.version,
                state="publish",
                step="review",
                envelope={"evidence": _evidence(artifact)},
                actor=Actor.system("worker w1"),
            ),
        )


# --- budgets -------------------------------------------------------------------------------
def _budgeted_run(as_bob, **budget) -> Run:  # noqa: ANN001, ANN003
    created = as_bob.post(
        "/api/v1/runs",
        {"workflow_type": "research", "execution": "external", "budget": budget},
        format="json",
    )
    assert created.status_code == 201, created.json()
    return Run.objects.get(pk=created.json()["id"])


def test_usage_over_the_attempts_limit_is_refused(as_bob, workflow):  # noqa: ANN001
    run = _budgeted_run(as_bob, max_attempts=1)
    answer = _commit(as_bob, run, "draft_answer", envelope={"budgets": {"attempts_used": 50}})
    _refused(answer, 409, "budget_exhausted", run)
    assert "attempts used 50 of 1" in answer.json()["detail"]
    assert run.budget_used.get("attempts_used", 0) == 0


def test_usage_over_the_token_or_cost_limit_is_refused(as_bob, workflow):  # noqa: ANN001
    run = _budgeted_run(as_bob, max_tokens=100, max_cost=1.0)
    tokens = _commit(as_bob, run, "draft_answer", envelope={"budgets": {"tokens_used": 101}})
    _refused(tokens, 409, "budget_exhausted", run)
    cost = _commit(as_bob, run, "draft_answer", envelope={"budgets": {"cost_used": 1.5}})
    _refused(cost, 409, "budget_exhausted", run)
    within = _commit(
        as_bob, run, "draft_answer", envelope={"budgets": {"tokens_used": 100, "cost_used": 1.0}}
    )
    assert within.status_code == 201, within.json()


def test_an_operators_grant_allows_the_usage(as_bob, workflow):  # noqa: ANN001
    run = _budgeted_run(as_bob, max_attempts=1)
    granted = as_bob.post(
        f"/api/v1/runs/{run.id}/actions/grant_budget",
        {"attempts": 60, "reason": "a long retry loop is expected"},
        format="json",
    )
    assert granted.status_code == 200, granted.json()
    answer = _commit(as_bob, run, "draft_answer", envelope={"budgets": {"attempts_used": 50}})
    assert answer.status_code == 201, answer.json()


def test_a_failing_commit_may_record_the_usage_that_exhausted_the_budget(as_bob, workflow):  # noqa: ANN001
    run = _budgeted_run(as_bob, max_tokens=100)
    answer = _commit(
        as_bob,
        run,
        "collect_sources",
        step="",
        status="failed",
        status_reason="budget exhausted",
        envelope={"budgets": {"tokens_used": 130}},
    )
    assert answer.status_code == 201, answer.json()


# --- terminal statuses -----------------------------------------------------------------------
def test_succeeded_at_a_state_that_is_not_terminal_is_refused(run, as_bob):  # noqa: ANN001
    answer = _commit(as_bob, run, "draft_answer", status="succeeded")
    _refused(answer, 422, "illegal_transition", run)
    assert "terminal" in answer.json()["detail"]


def test_entering_a_terminal_state_without_ending_the_run_is_refused(run, as_bob, bob, carol, acme):  # noqa: ANN001
    artifact = draft(acme)
    run = at_review(run, artifact)
    decide(ask(run, artifact, bob), carol)
    moved = _commit(as_bob, run, "publish", envelope={"evidence": _evidence(artifact)})
    assert moved.status_code == 201, moved.json()
    # publish → done is declared; "running" at done would leave a finished run running.
    answer = _commit(as_bob, run, "done", status="running")
    _refused(answer, 422, "illegal_transition", run)
    ends = _commit(as_bob, run, "done")
    assert ends.status_code == 201, ends.json()
    run.refresh_from_db()
    assert run.status == "succeeded"


def test_an_undeclared_transition_is_refused(run, as_bob):  # noqa: ANN001
    answer = _commit(as_bob, run, "publish")
    _refused(answer, 422, "illegal_transition", run)


# --- reproducibility -------------------------------------------------------------------------
def test_a_runners_commit_records_its_code_and_input_versions(run, as_bob):  # noqa: ANN001
    answer = _commit(
        as_bob,
        run,
        "draft_answer",
        code_version="php-runner-7",
        envelope={
            "inputs": {"prompt_version": "draft-v3", "policy_version": "p2", "model": "gpt-x"}
        },
    )
    assert answer.status_code == 201, answer.json()
    envelope = as_bob.get(f"/api/v1/runs/{run.id}/checkpoints/2").json()["envelope"]
    assert envelope["compatibility"]["workflow_code_version"] == "php-runner-7"
    assert envelope["inputs"]["prompt_version"] == "draft-v3"
    assert envelope["position"]["transition_version"] == "1"


def test_input_versions_that_are_not_names_are_refused(run, as_bob):  # noqa: ANN001
    answer = _commit(as_bob, run, "draft_answer", envelope={"inputs": {"prompt_version": 3}})
    _refused(answer, 422, "invalid_envelope", run)
    assert "inputs.prompt_version" in answer.json()["fields"]
