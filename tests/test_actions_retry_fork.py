"""Operator actions as services: retry a named step, fork from an older checkpoint."""

from __future__ import annotations

import pytest

from cairn.errors import (
    ActionNotAllowed,
    BudgetExhausted,
    CairnError,
    ConcurrentCheckpointWrite,
    InvalidRequest,
    LeaseHeld,
    NotFound,
    RunNotActive,
    SecretInEnvelope,
    UnknownCheckpoint,
    UnknownStep,
)
from checkpoints.models import Checkpoint, Run, RunStatus
from checkpoints.services.artifacts import artifact_store
from checkpoints.services.integrity import run_verify
from checkpoints.services.reads import checkpoint_envelope
from runtime.services.cancel import run_cancel
from runtime.services.forks import merge_patch, run_fork, run_fork_preview
from runtime.services.leases import lease_acquire
from runtime.services.retry import retry_choices, run_retry, workflow_steps
from tenants.services import Actor
from tests.actions_support import advance, audit_events, operation, resume_messages, worker_run

pytestmark = pytest.mark.django_db


@pytest.fixture
def at_review(acme, bob):  # noqa: ANN001
    """A worker run that collected sources, drafted (with an artifact) and waits for review."""
    run = worker_run(acme, bob)
    draft, _ = artifact_store(tenant=acme, data=b"the draft", media_type="text/plain")
    evidence = {"artifacts": [{"id": str(draft.id), "sha256": draft.sha256}], "validators": []}
    run = advance(run, bob, "draft_answer", envelope={"budgets": {"tokens_used": 40}})
    return advance(
        run, bob, "review", envelope={"evidence": evidence, "budgets": {"tokens_used": 90}}
    )


# --- retry -------------------------------------------------------------------------------
def test_retry_choices_are_the_named_steps_the_run_has_reached(at_review):
    assert [(c.step, c.state) for c in workflow_steps(at_review)] == [
        ("collect", "collect_sources"),
        ("draft", "draft_answer"),
        ("publish_answer", "publish"),
    ]
    # publish lies past the approval state the run waits at: it is not offered.
    assert [(c.step, c.state) for c in retry_choices(at_review)] == [
        ("collect", "collect_sources"),
        ("draft", "draft_answer"),
    ]


def test_retry_moves_back_to_the_steps_state_with_an_appended_checkpoint(at_review, bob):
    before = list(Checkpoint.objects.filter(run=at_review).order_by("sequence"))
    run = run_retry(
        tenant=at_review.tenant,
        run_id=at_review.id,
        step="draft",
        reason="the draft cites a retracted paper",
        expected_version=at_review.version,
        actor=Actor(user=bob),
    )
    assert (run.state, run.step, run.status) == ("draft_answer", "draft", RunStatus.RUNNING)
    assert run.version == at_review.version + 1
    after = list(Checkpoint.objects.filter(run=run).order_by("sequence"))
    # Appended, never rewritten: the old history is exactly as it was.
    assert [c.sha256 for c in after[: len(before)]] == [c.sha256 for c in before]
    newest = after[-1]
    assert (newest.sequence, newest.state, newest.is_evidence) == (4, "draft_answer", True)
    envelope = checkpoint_envelope(newest)
    assert envelope["control"]["reason"] == "the draft cites a retracted paper"
    assert envelope["control"]["actor"] == "bob"
    # The envelope is carried forward: evidence and budget usage are not lost.
    assert envelope["evidence"] == checkpoint_envelope(before[-1])["evidence"]
    assert envelope["budgets"]["tokens_used"] == 90
    assert run_verify(tenant=run.tenant, run_id=run.id)["ok"]
    assert resume_messages(run)[-1] == {"run_id": str(run.id), "expected_version": run.version}
    (event,) = audit_events(run, "run.retry")
    assert event.details["from_state"] == "review" and event.details["sequence"] == 4


def test_retry_accepts_the_state_name_too(at_review, bob):
    run = run_retry(
        tenant=at_review.tenant,
        run_id=at_review.id,
        step="collect_sources",
        reason="new sources",
        actor=Actor(user=bob),
    )
    assert (run.state, run.step) == ("collect_sources", "collect")


def test_retry_refuses_an_unknown_step_naming_the_real_ones(at_review, bob):
    with pytest.raises(UnknownStep) as caught:
        run_retry(
            tenant=at_review.tenant,
            run_id=at_review.id,
            step="review",  # an approval state runs no step
            reason="x",
            actor=Actor(user=bob),
        )
    assert "collect, draft, publish_answer" in caught.value.detail
    assert Checkpoint.objects.filter(run=at_review).count() == 3


def test_retry_refuses_a_stale_version(at_review, bob):
    with pytest.raises(ConcurrentCheckpointWrite):
        run_retry(
            tenant=at_review.tenant,
            run_id=at_review.id,
            step="draft",
            reason="x",
            expected_version=at_review.version - 1,
            actor=Actor(user=bob),
        )
    assert Checkpoint.objects.filter(run=at_review).count() == 3
    assert not audit_events(at_review, "run.retry")


def test_retry_refuses_a_cancelled_run(at_review, bob):
    run_cancel(tenant=at_review.tenant, run_id=at_review.id, reason="x", actor=Actor(user=bob))
    with pytest.raises(RunNotActive):
        run_retry(
            tenant=at_review.tenant,
            run_id=at_review.id,
            step="draft",
            reason="x",
            actor=Actor(user=bob),
        )


def test_retry_reopens_a_failed_run(at_review, bob):
    failed = advance(at_review, bob, "review", status="failed", status_reason="validator broke")
    run = run_retry(
        tenant=failed.tenant, run_id=failed.id, step="draft", reason="fixed", actor=Actor(user=bob)
    )
    assert (run.status, run.state) == (RunStatus.RUNNING, "draft_answer")


def test_retry_refuses_while_an_operation_outcome_is_unknown(at_review, bob):
    operation(at_review, "publish-1", "unknown")
    with pytest.raises(ActionNotAllowed) as caught:
        run_retry(
            tenant=at_review.tenant,
            run_id=at_review.id,
            step="draft",
            reason="x",
            actor=Actor(user=bob),
        )
    assert "publish-1" in caught.value.detail


def test_retry_refuses_an_exhausted_budget(acme, bob):
    run = worker_run(acme, bob, budget={"max_tokens": 10})
    run = advance(run, bob, "draft_answer", envelope={"budgets": {"tokens_used": 10}})
    with pytest.raises(BudgetExhausted):
        run_retry(tenant=acme, run_id=run.id, step="draft", reason="x", actor=Actor(user=bob))


def test_retry_refuses_while_a_worker_holds_the_lease(at_review, bob):
    lease_acquire(
        tenant=at_review.tenant,
        run_id=at_review.id,
        owner="worker-1",
        ttl_seconds=60,
        expected_version=at_review.version,
    )
    with pytest.raises(LeaseHeld):
        run_retry(
            tenant=at_review.tenant,
            run_id=at_review.id,
            step="draft",
            reason="x",
            actor=Actor(user=bob),
        )


def _cancelled(run, bob):  # noqa: ANN001, ANN202
    run_cancel(tenant=run.tenant, run_id=run.id, reason="x", actor=Actor(user=bob))
    return run, "draft"


def _status(status):  # noqa: ANN001, ANN202
    def made(run, bob):  # noqa: ANN001, ANN202
        Run.objects.filter(pk=run.pk).update(status=status)
        return run, "draft"

    return made


def _open_operation(run, bob):  # noqa: ANN001, ANN202
    operation(run, "publish-1", "unknown")
    return run, "draft"


def _spent_budget(run, bob):  # noqa: ANN001, ANN202
    spent = worker_run(run.tenant, bob, budget={"max_tokens": 10})
    return advance(spent, bob, "draft_answer", envelope={"budgets": {"tokens_used": 10}}), "draft"


def _past_approval(run, bob):  # noqa: ANN001, ANN202
    return run, "publish_answer"


def _unknown_step(run, bob):  # noqa: ANN001, ANN202
    return run, "no_such_step"


@pytest.mark.parametrize(
    "refused",
    [
        _cancelled,
        _status(RunStatus.CANCELLING),
        _status(RunStatus.RECONCILING),
        _open_operation,
        _spent_budget,
        _past_approval,
        _unknown_step,
    ],
)
def test_the_retry_preview_is_blocked_by_exactly_what_the_retry_refuses(at_review, bob, refused):
    # One function decides whether a retry may run (retry_check): the console's preview
    # says the refusal the action would answer, never "it will happen" before a refusal.
    from console.action_specs import ACTIONS

    run, step = refused(at_review, bob)
    run.refresh_from_db()
    with pytest.raises(CairnError) as caught:
        run_retry(tenant=run.tenant, run_id=run.id, step=step, reason="x", actor=Actor(user=bob))
    assert ACTIONS["retry"].summary(run, {"step": step}, None).blocked == caught.value.detail


def test_the_retry_preview_of_an_allowed_step_says_what_happens(at_review):
    from console.action_specs import ACTIONS

    summary = ACTIONS["retry"].summary(at_review, {"step": "draft"}, None)
    assert not summary.blocked
    assert summary.lines[0].startswith(f"Checkpoint #{at_review.checkpoint_sequence + 1}")


@pytest.mark.parametrize("status", [RunStatus.CANCELLED, RunStatus.CANCELLING, RunStatus.FAILED])
def test_the_cancel_preview_is_blocked_by_exactly_what_the_cancel_refuses(at_review, bob, status):
    # The same one-function rule for cancel (cancel_refusal): a run the cancel refuses is
    # never previewed as "the run stops now".
    from console.action_specs import ACTIONS

    Run.objects.filter(pk=at_review.id).update(status=status)
    run = Run.objects.get(pk=at_review.id)
    with pytest.raises(CairnError) as caught:
        run_cancel(tenant=run.tenant, run_id=run.id, reason="x", actor=Actor(user=bob))
    assert ACTIONS["cancel"].summary(run, {}, None).blocked == caught.value.detail


# --- fork --------------------------------------------------------------------------------
def test_merge_patch_follows_rfc_7396():
    target = {"a": "b", "c": {"d": "e", "f": "g"}}
    patch = {"a": "z", "c": {"f": None}}
    assert merge_patch(target, patch) == {"a": "z", "c": {"d": "e"}}
    assert merge_patch({"a": [1, 2]}, {"a": [3]}) == {"a": [3]}
    assert merge_patch({"a": "b"}, {"b": {"c": None}}) == {"a": "b", "b": {}}
    assert target == {"a": "b", "c": {"d": "e", "f": "g"}}  # not mutated


def test_fork_starts_a_new_run_chained_to_the_chosen_checkpoint(at_review, bob):
    source_before = Run.objects.get(pk=at_review.id)
    second = Checkpoint.objects.get(run=at_review, sequence=2)
    result = run_fork(
        tenant=at_review.tenant,
        run_id=at_review.id,
        from_sequence=2,
        inputs_patch={"lang": "de", "question": None, "depth": 2},
        reason="try the German sources",
        actor=Actor(user=bob),
    )
    fork = result.run
    assert fork.id != at_review.id
    assert (fork.forked_from_run_id, fork.forked_from_checkpoint_id) == (at_review.id, second.id)
    assert (fork.state, fork.status, fork.version, fork.checkpoint_sequence) == (
        "draft_answer",
        RunStatus.RUNNING,
        1,
        1,
    )
    genesis = Checkpoint.objects.get(run=fork)
    assert (genesis.parent_id, genesis.parent_sha256) == (second.id, second.sha256)
    envelope = checkpoint_envelope(genesis)
    assert envelope["identity"]["parent_checkpoint_id"] == str(second.id)
    assert envelope["inputs"]["values"] == {"lang": "de", "depth": 2}
    assert envelope["budgets"]["tokens_used"] == 40  # as used at checkpoint 2, not later
    assert fork.budget_used["tokens_used"] == 40
    assert envelope["evidence"] == checkpoint_envelope(second)["evidence"]
    assert resume_messages(fork) == [{"run_id": str(fork.id), "expected_version": 1}]
    assert run_verify(tenant=fork.tenant, run_id=fork.id)["ok"]
    # The source run is untouched.
    source_after = Run.objects.get(pk=at_review.id)
    assert (source_after.version, source_after.updated_at, source_after.status) == (
        source_before.version,
        source_before.updated_at,
        source_before.status,
    )
    assert Checkpoint.objects.filter(run=at_review).count() == 3
    (on_fork,) = audit_events(fork, "run.fork")
    (on_source,) = audit_events(at_review, "run.forked")
    assert on_fork.reason == on_source.reason == "try the German sources"
    assert on_fork.details["inputs_patched"] == ["depth", "lang", "question"]


def test_fork_warns_about_effects_confirmed_after_the_checkpoint(acme, bob):
    # Confirmed before checkpoint 3 and recorded in it: a fork from 3 does not repeat it.
    run = advance(worker_run(acme, bob), bob, "draft_answer")
    operation(run, "notify-1", "confirmed", action="notify")
    run = advance(
        run,
        bob,
        "review",
        envelope={
            "side_effects": [
                {
                    "idempotency_key": "notify-1",
                    "status": "confirmed",
                    "provider_operation_id": "prov-1",
                }
            ]
        },
    )
    run = advance(run, bob, "publish")
    operation(run, "publish-1", "confirmed")
    operation(run, "publish-2", "unknown")
    operation(run, "publish-3", "failed")
    warnings = run_fork_preview(tenant=acme, run_id=run.id, from_sequence=3)
    assert [(w["idempotency_key"], w["status"]) for w in warnings] == [
        ("publish-1", "confirmed"),
        ("publish-2", "unknown"),
    ]
    assert "may perform it again" in warnings[0]["detail"]
    earlier = run_fork_preview(tenant=acme, run_id=run.id, from_sequence=2)
    assert [w["idempotency_key"] for w in earlier] == ["notify-1", "publish-1", "publish-2"]
    result = run_fork(
        tenant=acme, run_id=run.id, from_sequence=3, reason="again", actor=Actor(user=bob)
    )
    assert result.warnings == warnings
    assert audit_events(result.run, "run.fork")[0].details["may_repeat"] == [
        "publish-1",
        "publish-2",
    ]


def test_a_fork_never_starts_past_an_approval_state(at_review, bob):
    run = advance(at_review, bob, "publish")  # checkpoint 4, past the approval state review
    for call in (
        lambda: run_fork_preview(tenant=run.tenant, run_id=run.id, from_sequence=4),
        lambda: run_fork(
            tenant=run.tenant, run_id=run.id, from_sequence=4, reason="x", actor=Actor(user=bob)
        ),
    ):
        with pytest.raises(ActionNotAllowed, match="past the approval state review"):
            call()
    assert not Run.objects.filter(forked_from_run=run).exists()


def test_retry_refuses_a_step_past_the_approval_state_and_one_not_reached(at_review, bob):
    with pytest.raises(ActionNotAllowed, match="has not reached step publish_answer"):
        run_retry(
            tenant=at_review.tenant,
            run_id=at_review.id,
            step="publish_answer",
            reason="skip the review",
            actor=Actor(user=bob),
        )
    # Once published and sent back to redo the draft, the run waits at review again: its
    # earlier approval was for the earlier position; publish is past the approval state.
    run = advance(at_review, bob, "publish", status="failed")
    run_retry(tenant=run.tenant, run_id=run.id, step="draft", reason="redo", actor=Actor(user=bob))
    run = advance(run, bob, "review")
    assert run.status == RunStatus.WAITING_APPROVAL
    with pytest.raises(ActionNotAllowed, match="after the approval state review"):
        run_retry(
            tenant=run.tenant,
            run_id=run.id,
            step="publish_answer",
            reason="skip the review",
            actor=Actor(user=bob),
        )
    run.refresh_from_db()
    assert run.status == RunStatus.WAITING_APPROVAL and run.state == "review"
    assert [c.step for c in retry_choices(run)] == ["collect", "draft"]


def test_retry_of_a_step_the_run_passed_its_approval_for_is_allowed(at_review, bob):
    run = advance(at_review, bob, "publish", status="failed")
    again = run_retry(
        tenant=run.tenant,
        run_id=run.id,
        step="publish_answer",
        reason="provider fixed",
        actor=Actor(user=bob),
    )
    assert again.status == RunStatus.RUNNING and again.state == "publish"
    # And back before the approval: the run will ask again there.
    back = run_retry(
        tenant=run.tenant, run_id=run.id, step="draft", reason="redo", actor=Actor(user=bob)
    )
    assert back.state == "draft_answer"


def test_fork_refuses_an_unknown_sequence_and_another_tenants_run(at_review, bob, globex):
    with pytest.raises(UnknownCheckpoint):
        run_fork(
            tenant=at_review.tenant,
            run_id=at_review.id,
            from_sequence=9,
            reason="x",
            actor=Actor(user=bob),
        )
    with pytest.raises(NotFound):
        run_fork(
            tenant=globex, run_id=at_review.id, from_sequence=1, reason="x", actor=Actor(user=bob)
        )
    assert Run.objects.count() == 1


def test_fork_refuses_bad_input_and_writes_nothing(at_review, bob):
    tenant, actor = at_review.tenant, Actor(user=bob)
    with pytest.raises(InvalidRequest):
        run_fork(tenant=tenant, run_id=at_review.id, from_sequence=1, reason="", actor=actor)
    with pytest.raises(SecretInEnvelope):
        run_fork(
            tenant=tenant,
            run_id=at_review.id,
            from_sequence=1,
            inputs_patch={"password": "hunter22"},
            reason="x",
            actor=actor,
        )
    with pytest.raises(ConcurrentCheckpointWrite):
        run_fork(
            tenant=tenant,
            run_id=at_review.id,
            from_sequence=1,
            reason="x",
            expected_version=1,
            actor=actor,
        )
    assert Run.objects.count() == 1


def test_fork_refuses_a_checkpoint_in_a_terminal_state(at_review, bob):
    done = advance(advance(at_review, bob, "publish"), bob, "done")
    assert done.status == RunStatus.SUCCEEDED
    with pytest.raises(ActionNotAllowed):
        run_fork(
            tenant=done.tenant,
            run_id=done.id,
            from_sequence=done.checkpoint_sequence,
            reason="x",
            actor=Actor(user=bob),
        )
    # A finished run can still be forked from an earlier checkpoint.
    fork = run_fork(
        tenant=done.tenant, run_id=done.id, from_sequence=2, reason="x", actor=Actor(user=bob)
    ).run
    assert fork.state == "draft_answer"
