"""The commit protocol: version check, transitions, envelope schema, artifacts, hash chain."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from cairn.errors import (
    ArtifactHashMismatch,
    ConcurrentCheckpointWrite,
    IllegalTransition,
    InvalidEnvelope,
    RunNotActive,
    SecretInEnvelope,
)
from checkpoints.models import Checkpoint, OutboxMessage, Run
from checkpoints.services.artifacts import artifact_store
from checkpoints.services.checkpoints import CommitRequest, checkpoint_commit
from checkpoints.services.reads import checkpoint_envelope
from tenants.services import Actor

pytestmark = pytest.mark.django_db


def commit(run, bob, **kwargs):  # noqa: ANN001, ANN201
    params = {
        "expected_version": 1,
        "state": "draft_answer",
        "step": "draft_answer",
        "envelope": {},
    }
    params.update(kwargs)
    return checkpoint_commit(
        tenant=run.tenant, run_id=run.id, request=CommitRequest(actor=Actor(user=bob), **params)
    )


def test_it_commits_the_next_checkpoint_chained_to_its_parent(run, bob):
    result = commit(run, bob)
    run.refresh_from_db()
    genesis, second = Checkpoint.objects.filter(run=run).order_by("sequence")
    assert (result.sequence, result.run_version) == (2, 2)
    assert (run.version, run.checkpoint_sequence, run.state) == (2, 2, "draft_answer")
    assert second.parent_sha256 == genesis.sha256 == result.parent_sha256
    assert run.latest_checkpoint_sha256 == second.sha256 == result.sha256
    envelope = checkpoint_envelope(second)
    assert envelope["identity"]["parent_checkpoint_id"] == str(genesis.id)
    # Left-out groups are carried forward from the parent: the run's inputs survive.
    assert envelope["inputs"]["values"] == {"question": "why?"}


def test_it_refuses_a_stale_version_and_writes_nothing(run, bob):
    commit(run, bob)
    outbox_before = OutboxMessage.objects.count()
    with pytest.raises(ConcurrentCheckpointWrite):
        commit(run, bob, expected_version=1, state="review")
    run.refresh_from_db()
    assert (run.version, run.state) == (2, "draft_answer")
    assert Checkpoint.objects.filter(run=run).count() == 2
    assert OutboxMessage.objects.count() == outbox_before


def test_it_refuses_a_transition_the_workflow_does_not_declare(run, bob):
    with pytest.raises(IllegalTransition):
        commit(run, bob, state="publish")
    with pytest.raises(IllegalTransition):
        commit(run, bob, state="no_such_state")
    assert Checkpoint.objects.filter(run=run).count() == 1


def test_it_refuses_an_envelope_that_breaks_the_schema(run, bob):
    with pytest.raises(InvalidEnvelope) as caught:
        commit(run, bob, envelope={"evidence": {"artifacts": [{"id": "nope"}], "validators": []}})
    assert any(path.startswith("evidence.artifacts.0") for path in caught.value.fields)
    with pytest.raises(InvalidEnvelope):
        commit(run, bob, envelope={"identity": {}})


def test_it_refuses_a_credential_in_the_envelope(run, bob):
    with pytest.raises(SecretInEnvelope):
        commit(
            run,
            bob,
            envelope={"control": {"reason": "Authorization: Bearer abcdefghijklmnopqrstuvwxyz"}},
        )
    with pytest.raises(SecretInEnvelope):
        commit(run, bob, envelope={"inputs": {"api_key": "plain-value"}})
    commit(run, bob, envelope={"inputs": {"api_key": "env:OPENAI_API_KEY"}})


def test_it_checks_referenced_artifacts_against_their_stored_hash(run, bob):
    artifact, _ = artifact_store(tenant=run.tenant, data=b"draft one", media_type="text/plain")
    wrong = {"artifacts": [{"id": str(artifact.id), "sha256": "0" * 64}], "validators": []}
    with pytest.raises(ArtifactHashMismatch):
        commit(run, bob, envelope={"evidence": wrong})
    right = {"artifacts": [{"id": str(artifact.id), "sha256": artifact.sha256}], "validators": []}
    assert commit(run, bob, envelope={"evidence": right}).sequence == 2


def test_it_refuses_an_artifact_of_another_tenant(run, bob, globex):
    theirs, _ = artifact_store(tenant=globex, data=b"secret draft", media_type="text/plain")
    ref = {"artifacts": [{"id": str(theirs.id), "sha256": theirs.sha256}], "validators": []}
    with pytest.raises(ArtifactHashMismatch):
        commit(run, bob, envelope={"evidence": ref})


def test_budget_usage_never_decreases(run, bob):
    commit(run, bob, envelope={"budgets": {"tokens_used": 100}})
    with pytest.raises(InvalidEnvelope):
        commit(
            run, bob, expected_version=2, state="review", envelope={"budgets": {"tokens_used": 10}}
        )


def test_a_terminal_run_accepts_no_more_checkpoints(run, bob):
    commit(run, bob)
    commit(run, bob, expected_version=2, state="review")
    commit(run, bob, expected_version=3, state="rejected", status="failed")
    run.refresh_from_db()
    assert run.status == "failed"
    with pytest.raises(RunNotActive):
        commit(run, bob, expected_version=4, state="rejected")


def test_checkpoints_are_immutable_in_the_orm(run):
    from checkpoints.models import ImmutableCheckpoint

    checkpoint = Checkpoint.objects.get(run=run)
    checkpoint.state = "tampered"
    with pytest.raises(ImmutableCheckpoint):
        checkpoint.save()
    with pytest.raises(ImmutableCheckpoint):
        checkpoint.delete()
    with pytest.raises(ImmutableCheckpoint):
        Checkpoint.objects.filter(run=run).update(state="x")
    with pytest.raises(ImmutableCheckpoint):
        Checkpoint.objects.filter(run=run).delete()
    assert Run.objects.get(pk=run.pk).checkpoints.get().state == "collect_sources"


def test_an_external_runs_checkpoint_event_is_recorded_without_a_dispatch(run, bob):
    from checkpoints.services.outbox import outbox_lag_seconds

    commit(run, bob)
    event = OutboxMessage.objects.filter(run=run).latest("id")
    assert event.kind == "run.checkpointed"
    assert event.sent_at is not None and event.attempts == 0
    assert outbox_lag_seconds() == 0.0


def test_a_lease_is_held_only_while_it_has_an_owner_and_has_not_expired(run):
    now = timezone.now()
    assert not run.lease_held(now)
    run.lease_owner, run.lease_expires_at = "worker-a", now + timedelta(seconds=30)
    assert run.lease_held(now)
    assert not run.lease_held(now + timedelta(seconds=30))  # expired at that instant
    run.lease_owner = ""  # released
    assert not run.lease_held(now)
