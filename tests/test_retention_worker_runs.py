"""Retention of runs Cairn's own worker drove: the checkpoints of their plain steps are
history a policy may compact; the ones that carry transition evidence (a side effect's
pending and confirmed checkpoints, the approval a run used and the checkpoint it was asked
at) stay, with the genesis and the final checkpoint."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from approvals.models import ApprovalRequest
from checkpoints.models import Checkpoint, Run, RunStatus
from checkpoints.services.integrity import run_verify
from retention.policies import PolicyInput, retention_policy_save
from retention.services import retention_apply
from runtime.executor import run_advance
from runtime.services.runs import run_create
from tenants.services import Actor
from tests.approvals_support import decide, start_demo
from tests.effects_workflows import effects_demo

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _publishing(settings, publishing_service):  # noqa: ANN001
    settings.CAIRN_PUBLISHING_URL = publishing_service.url
    settings.CAIRN_PUBLISHING_TOKEN_REF = ""


def advance(run: Run) -> Run:
    """One worker turn in this process: restore, then steps until the run waits or ends."""
    run.refresh_from_db()
    run_advance(run_id=run.pk, expected_version=run.version, owner="test-worker")
    run.refresh_from_db()
    return run


def ended_long_ago(run: Run) -> None:
    Run.objects.filter(pk=run.pk).update(updated_at=timezone.now() - timedelta(days=40))


def compact(tenant) -> None:  # noqa: ANN001
    retention_policy_save(
        tenant=tenant, data=PolicyInput(intermediate_days=30), actor=Actor.system("test-admin")
    )
    retention_apply()


@pytest.fixture
def finished(acme, tmp_path) -> Run:  # noqa: ANN001
    """An effects_demo run (prepare → publish, an effect → announce → done) driven to its end
    by the executor in this process, ended 40 days ago."""
    assert effects_demo.workflow_type == "effects_demo"
    run = run_create(
        tenant=acme,
        workflow_type="effects_demo",
        inputs={"title": "Why build cairns?", "count_dir": str(tmp_path)},
        actor=Actor.system("test"),
    )
    run = advance(run)
    assert run.status == RunStatus.SUCCEEDED, run.status_reason
    ended_long_ago(run)
    return run


def history(run: Run) -> dict[int, tuple[str, str, bool]]:
    return {
        c.sequence: (c.state, c.step, c.is_evidence)
        for c in Checkpoint.objects.filter(run=run).order_by("sequence")
    }


def test_a_worker_runs_plain_steps_are_compacted_and_its_evidence_stays(acme, finished):
    before = history(finished)
    final = max(before)
    # A step's result names its step; the genesis and the effect's pending and confirmed
    # checkpoints name none.
    step_results = {seq for seq, (_, step, _) in before.items() if step and seq != final}
    assert len(step_results) == 2 and len(before) == 6, before
    compact(acme)
    after = history(finished)
    assert set(after) == set(before) - step_results
    assert all(is_evidence for seq, (_, _, is_evidence) in after.items() if seq != final)
    result = run_verify(tenant=acme, run_id=finished.pk)
    assert result["ok"], result["problems"]
    assert sum(gap["count"] for gap in result["compacted"]) == len(step_results)


def test_the_demo_runs_approval_stays_and_its_plain_steps_go(acme, bob, carol):
    run = start_demo(acme, bob)
    assert advance(run).status == RunStatus.WAITING_APPROVAL
    request = ApprovalRequest.objects.get(run=run)
    decide(request, carol)
    assert advance(run).status == RunStatus.SUCCEEDED, run.status_reason
    before = history(run)
    asked_at = Checkpoint.objects.get(pk=request.checkpoint_id).sequence
    used = {seq for seq, (_, step, _) in before.items() if step == "request_approval"}
    assert len(used) == 1, before
    ended_long_ago(run)
    compact(acme)
    after = history(run)
    assert {1, asked_at, max(before)} | used <= set(after)
    for step in ("extract_claims", "draft_answer"):  # plain steps, nothing points at them
        assert step not in {s for _, s, _ in after.values()}, (step, after)
    assert run_verify(tenant=acme, run_id=run.pk)["ok"]
