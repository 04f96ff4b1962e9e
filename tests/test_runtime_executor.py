"""The executor in process: one step per commit, attempts counted before a step runs,
retries, permanent failures, budgets, leases, stale and duplicate commands."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from checkpoints.models import Checkpoint, OutboxMessage, Run, RunStatus
from checkpoints.services.integrity import run_verify
from runtime import Next, PermanentStepError, RetryableStepError, Workflow
from runtime.services.leases import lease_acquire
from tests.runtime_support import advance, envelope_at, start

pytestmark = pytest.mark.django_db

RESEARCH_STEPS = ["collect_sources", "extract_claims", "draft_answer", "validate_citations"]

calls: dict[str, int] = {}

flaky = Workflow("flaky", version="1")


@flaky.step("call_provider", next="done")
def call_provider(ctx):  # noqa: ANN001, ANN201
    calls["call_provider"] = calls.get("call_provider", 0) + 1
    raise RetryableStepError("the provider answered 503", delay_seconds=0)


flaky.terminal("done")

doomed = Workflow("doomed", version="1")


@doomed.step("check", next="done")
def check(ctx):  # noqa: ANN001, ANN201
    raise PermanentStepError("the objective names no sources")


doomed.terminal("done")

chatty = Workflow("chatty", version="1")


@chatty.step("think", next="done")
def think(ctx):  # noqa: ANN001, ANN201
    calls["think"] = calls.get("think", 0) + 1
    for round_ in range(10):
        ctx.model.complete(prompt=f"round {round_}: think about cairns at length " * 5)
    return {"rounds": 10}


chatty.terminal("done")

wayward = Workflow("wayward", version="1")


@wayward.step("start", next=["left", "right"])
def start_step(ctx):  # noqa: ANN001, ANN201
    return Next("done", {"went": "nowhere declared"})


wayward.terminal("left", "right", "done")


inexact = Workflow("inexact", version="1")


@inexact.step("count", next="done")
def count(ctx):  # noqa: ANN001, ANN201
    return {"grains_of_sand": 2**70}


inexact.terminal("done")


@pytest.fixture(autouse=True)
def _reset_calls() -> None:
    calls.clear()


def test_it_runs_the_research_workflow_to_its_approval_wait_one_checkpoint_per_step(acme):
    run = start(acme, "research", question="Why build cairns?")
    assert advance(run) == "waiting_approval"
    run.refresh_from_db()
    assert (run.state, run.status, run.version) == ("request_approval", "waiting_approval", 5)
    steps = list(Checkpoint.objects.filter(run=run).values_list("step", flat=True))
    assert steps == ["", *RESEARCH_STEPS]
    assert run_verify(tenant=acme, run_id=run.pk)["ok"]
    latest = envelope_at(run, 5)
    # Evidence is cumulative: the latest checkpoint alone restores the run.
    names = [ref["name"] for ref in latest["evidence"]["artifacts"]]
    assert {"claims", "draft"} <= set(names)
    assert sum(name.startswith("source:") for name in names) == 3
    assert set(latest["evidence"]["outputs"]) == set(RESEARCH_STEPS)
    assert {"name": "citations", "passed": True} in [
        {"name": v["name"], "passed": v["passed"]} for v in latest["evidence"]["validators"]
    ]
    assert latest["budgets"]["attempts_used"] == 4
    assert latest["budgets"]["tokens_used"] > 0
    assert latest["compatibility"]["workflow_code_version"] == "1"
    assert latest["control"]["lease_owner"] == "worker-a"
    assert run.lease_owner == ""  # released at the end of the batch


def test_a_stale_command_is_a_logged_no_op(acme, caplog):
    run = start(acme, "research")
    advance(run)
    run.refresh_from_db()
    before = (
        run.version,
        Checkpoint.objects.filter(run=run).count(),
        OutboxMessage.objects.count(),
    )
    assert advance(run, version=2) == "stale"
    run.refresh_from_db()
    after = (run.version, Checkpoint.objects.filter(run=run).count(), OutboxMessage.objects.count())
    assert after == before
    assert "stale command ignored" in caplog.text


def test_a_duplicate_command_for_a_waiting_run_writes_nothing(acme):
    run = start(acme, "research")
    advance(run)
    run.refresh_from_db()
    before = (run.version, run.checkpoint_sequence, run.budget_used)
    assert advance(run) == "waiting_approval"
    assert advance(run, owner="worker-b") == "waiting_approval"
    run.refresh_from_db()
    assert (run.version, run.checkpoint_sequence, run.budget_used) == before
    assert run.restore_count == 0


def test_a_worker_backs_off_while_another_holds_the_lease(acme):
    run = start(acme, "research")
    lease_acquire(tenant=acme, run_id=run.pk, owner="worker-a", ttl_seconds=60, expected_version=1)
    assert advance(run, owner="worker-b") == "lease_held"
    run.refresh_from_db()
    assert (run.lease_owner, run.version, run.checkpoint_sequence) == ("worker-a", 1, 1)
    assert run.budget_used.get("attempts_used", 0) == 0
    assert run.restore_count == 0


def test_taking_over_an_expired_lease_counts_a_restore(acme):
    run = start(acme, "research")
    lease_acquire(tenant=acme, run_id=run.pk, owner="dead", ttl_seconds=60, expected_version=1)
    Run.objects.filter(pk=run.pk).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
    assert advance(run, owner="worker-b") == "waiting_approval"
    run.refresh_from_db()
    assert run.restore_count == 1


def test_a_step_that_keeps_failing_exhausts_its_attempts_and_the_run_fails_with_that_reason(
    acme,
):
    run = start(acme, "flaky", budget={"max_attempts": 3})
    assert advance(run) == "waiting_retry"
    run.refresh_from_db()
    assert run.status == RunStatus.WAITING_RETRY
    assert "the provider answered 503" in run.status_reason
    retry = OutboxMessage.objects.filter(run=run).order_by("-id").first()
    assert retry.payload == {"run_id": str(run.pk), "expected_version": run.version}
    assert retry.available_at == run.next_eligible_at
    assert advance(run) == "waiting_retry"
    assert advance(run) == "failed"
    run.refresh_from_db()
    assert run.status == RunStatus.FAILED
    assert run.status_reason.startswith("budget exhausted: attempts used 3 of 3")
    assert "the provider answered 503" in run.status_reason
    assert calls["call_provider"] == 3
    assert run.budget_used["attempts_used"] == 3
    # Every failed attempt is history: status checkpoints, none accepting the step.
    assert list(Checkpoint.objects.filter(run=run).values_list("step", flat=True)) == [""] * 4
    assert advance(run) == "inactive"
    assert calls["call_provider"] == 3


def test_a_retry_is_not_run_before_its_eligible_time(acme):
    run = start(acme, "flaky", budget={"max_attempts": 3})
    advance(run)
    Run.objects.filter(pk=run.pk).update(next_eligible_at=timezone.now() + timedelta(hours=1))
    assert advance(run) == "not_due"
    assert calls["call_provider"] == 1


def test_a_permanent_error_fails_the_run_with_the_steps_reason(acme):
    run = start(acme, "doomed")
    assert advance(run) == "failed"
    run.refresh_from_db()
    assert run.status_reason == "check failed: the objective names no sources"
    assert envelope_at(run, 2)["control"]["reason"] == run.status_reason


def test_a_crash_loop_never_grants_new_attempts(acme):
    """Workers that die mid-step have already spent their attempt: the run fails once the
    attempts are used, without running the step again."""
    run = start(acme, "flaky", budget={"max_attempts": 2})
    for dead in ("dead-1", "dead-2"):
        run.refresh_from_db()
        lease_acquire(
            tenant=acme, run_id=run.pk, owner=dead, ttl_seconds=60, expected_version=run.version
        )
        # What run_advance does before calling the step: count the attempt under the lease.
        from runtime.lease import LeaseKeeper

        LeaseKeeper(run=run, owner=dead, version=run.version, ttl_seconds=60).charge(
            attempts_used=1
        )
        Run.objects.filter(pk=run.pk).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
    assert advance(run, owner="survivor") == "failed"
    run.refresh_from_db()
    assert run.status_reason == "budget exhausted: attempts used 2 of 2"
    assert run.restore_count == 2
    assert "call_provider" not in calls
    assert envelope_at(run, 2)["budgets"]["attempts_used"] == 2


def test_a_model_call_is_refused_once_the_token_budget_is_spent(acme):
    run = start(acme, "chatty", budget={"max_attempts": 5, "max_tokens": 200})
    assert advance(run) == "failed"
    run.refresh_from_db()
    assert run.status_reason.startswith("think failed: budget exhausted: no tokens left")
    assert run.budget_used["tokens_used"] >= 200
    assert calls["think"] == 1


def test_a_run_past_its_deadline_fails_before_any_step(acme):
    run = start(
        acme,
        "research",
        budget={"deadline": (timezone.now() - timedelta(minutes=1)).isoformat()},
    )
    assert advance(run) == "failed"
    run.refresh_from_db()
    assert "the deadline" in run.status_reason and "has passed" in run.status_reason
    assert run.budget_used.get("attempts_used", 0) == 0


def test_a_step_choosing_an_undeclared_state_pauses_the_run_for_review(acme):
    run = start(acme, "wayward")
    assert advance(run) == "paused"
    run.refresh_from_db()
    assert run.status == RunStatus.PAUSED_FOR_REVIEW
    assert "chose 'done', which it does not declare" in run.status_reason
    assert run.checkpoint_sequence == 1


def test_a_step_output_json_cannot_carry_exactly_pauses_the_run_with_the_reason(acme):
    run = start(acme, "inexact")
    assert advance(run) == "paused"
    run.refresh_from_db()
    assert run.status == RunStatus.PAUSED_FOR_REVIEW
    assert "returned output that is not JSON" in run.status_reason
    assert "the output.grains_of_sand is an integer outside" in run.status_reason
    assert run.checkpoint_sequence == 1


def test_a_worker_hands_over_after_its_batch_of_steps(acme, settings):
    settings.CAIRN_STEPS_PER_TASK = 2
    run = start(acme, "research")
    assert advance(run) == "handed_over"
    run.refresh_from_db()
    assert (run.checkpoint_sequence, run.status, run.lease_owner) == (3, "running", "")
    handover = OutboxMessage.objects.filter(run=run).order_by("-id").first()
    assert handover.payload == {"run_id": str(run.pk), "expected_version": run.version}
    assert advance(run, owner="worker-b") == "handed_over"
    assert advance(run, owner="worker-c") == "waiting_approval"
    run.refresh_from_db()
    assert run.restore_count == 0
    assert run_verify(tenant=acme, run_id=run.pk)["ok"]


def test_a_command_for_a_run_its_caller_drives_is_ignored(acme):
    from runtime.services.runs import run_create
    from tenants.services import Actor

    run = run_create(
        tenant=acme, workflow_type="research", execution="external", actor=Actor.system("t")
    )
    assert advance(run) == "inactive"
    run.refresh_from_db()
    assert (run.version, run.checkpoint_sequence, run.lease_owner) == (1, 1, "")


ledger = Workflow("ledger", version="1")


@ledger.step("note", next="done")
def note(ctx):  # noqa: ANN001, ANN201
    # A side effect recorded by hand through the context's public commit (the effect API's
    # way), with the worker holding the lease: its operation is reserved and confirmed first,
    # as a commit names only the run's own operations as they stand.
    from checkpoints.models import Run
    from runtime.services.operations import operation_confirm, operation_reserve
    from tenants.services import Actor

    run = Run.objects.select_related("tenant").get(pk=ctx.run_id)
    key = f"ledger.{ctx.run_id}"
    operation, _ = operation_reserve(
        tenant=run.tenant,
        run_id=run.pk,
        idempotency_key=key,
        action="note",
        target="ledger",
        request_fingerprint="f",
        actor=Actor.system("step"),
    )
    operation_confirm(
        operation_id=operation.id, provider_operation_id="n-1", result={}, actor=Actor.system("s")
    )
    ctx.commit_side_effects(
        [
            {
                "idempotency_key": key,
                "action": "note",
                "status": "confirmed",
                "provider_operation_id": "n-1",
            }
        ]
    )
    return {"noted": True}


ledger.terminal("done")


def test_a_step_commits_its_side_effects_under_its_lease_through_the_context(acme):
    run = start(acme, "ledger")
    assert advance(run) == "succeeded"
    rows = list(
        Checkpoint.objects.filter(run=run)
        .order_by("sequence")
        .values_list("state", "step", "actor")
    )
    assert rows == [
        ("note", "", "test"),
        ("note", "", "worker worker-a"),  # the side-effects checkpoint names no step
        ("done", "note", "worker worker-a"),
    ]
    entry = {
        "idempotency_key": f"ledger.{run.pk}",
        "action": "note",
        "status": "confirmed",
        "provider_operation_id": "n-1",
    }
    assert envelope_at(run, 2)["side_effects"] == [entry]
    assert envelope_at(run, 3)["side_effects"] == [entry]  # the step's own commit keeps it
    assert run_verify(tenant=acme, run_id=run.pk)["ok"]


def test_the_effect_api_reaches_no_private_part_of_the_step_context() -> None:
    import ast
    from pathlib import Path

    import runtime.effects

    tree = ast.parse(Path(runtime.effects.__file__).read_text())
    private = sorted(
        {
            node.attr
            for node in ast.walk(tree)
            if isinstance(node, ast.Attribute)
            and node.attr.startswith("_")
            and not node.attr.startswith("__")
            and "ctx" in ast.unparse(node.value)
        }
    )
    assert private == []
