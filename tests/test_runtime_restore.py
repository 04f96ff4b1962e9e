"""The restore procedure: older envelope schemas are migrated; a checkpoint the code cannot
continue from (removed step, unmigratable schema, broken chain, damaged artifact) pauses
the run for review and never restarts it."""

from __future__ import annotations

import copy

import pytest
from django.core.files.storage import default_storage

from checkpoints.models import Artifact, Checkpoint, Run, RunStatus
from checkpoints.services.integrity import run_verify
from runtime import Workflow
from runtime.definition import registry_add
from runtime.registry import workflow_code
from tenants.models import AuditEvent
from tests.runtime_support import advance, checkpoint_write_raw, envelope_at, start

pytestmark = pytest.mark.django_db


def _v1_from(v2: dict) -> dict:
    """The schema-1 shape (see envelope._v1_to_v2): flat state/step, artifact_refs, budget."""
    v1 = copy.deepcopy(v2)
    v1["schema_version"] = 1
    position = v1.pop("position")
    v1["state"], v1["step"] = position["state"], position["step"]
    evidence = v1["evidence"]
    evidence["artifact_refs"] = [
        {"id": ref["id"], "sha256": ref["sha256"], "name": ref["name"]}
        for ref in evidence.pop("artifacts")
    ]
    v1["budget"] = v1.pop("budgets")
    del v1["compatibility"]
    return v1


def test_a_checkpoint_in_an_older_envelope_schema_is_migrated_and_the_run_continues(acme, settings):
    settings.CAIRN_STEPS_PER_TASK = 1
    run = start(acme, "research")
    advance(run)  # collect_sources, then hand over
    older = checkpoint_write_raw(
        run,
        _v1_from(envelope_at(run, 2)),
        state="extract_claims",
        step="",
        schema_version=1,
    )
    stored_sha = older.sha256
    settings.CAIRN_STEPS_PER_TASK = 20
    assert advance(run) == "waiting_approval"
    run.refresh_from_db()
    assert run.state == "request_approval"
    # The old checkpoint is untouched history; the next one is written in schema 2 and
    # carries the migrated evidence forward.
    older = Checkpoint.objects.get(pk=older.pk)
    assert (older.schema_version, older.sha256) == (1, stored_sha)
    successor = Checkpoint.objects.get(run=run, sequence=older.sequence + 1)
    assert (successor.schema_version, successor.step) == (2, "extract_claims")
    sources = [
        ref["name"]
        for ref in envelope_at(run, successor.sequence)["evidence"]["artifacts"]
        if ref["name"].startswith("source:")
    ]
    assert len(sources) == 3
    assert run_verify(tenant=acme, run_id=run.pk)["ok"]


def _stop_after_first_step(acme, settings) -> Run:  # noqa: ANN001
    settings.CAIRN_STEPS_PER_TASK = 1
    run = start(acme, "research")
    advance(run)
    run.refresh_from_db()
    return run


def _assert_paused_without_a_new_checkpoint(run: Run, sequence: int, reason: str) -> None:
    run.refresh_from_db()
    assert run.status == RunStatus.PAUSED_FOR_REVIEW
    assert reason in run.status_reason
    assert run.checkpoint_sequence == sequence
    assert run.lease_owner == ""
    assert AuditEvent.objects.filter(run_id=run.pk, action="run.paused_for_review").exists()
    # Paused is final until an operator acts: a further command changes nothing.
    assert advance(run) == "inactive"


def test_a_schema_no_migration_covers_pauses_the_run_for_review(acme, settings):
    run = _stop_after_first_step(acme, settings)
    ancient = {"schema_version": 0, "state": "extract_claims", "evidence": {}}
    checkpoint_write_raw(run, ancient, state="extract_claims", schema_version=0)
    version = Run.objects.get(pk=run.pk).version
    assert advance(run) == "paused"
    _assert_paused_without_a_new_checkpoint(run, 3, "no migration covers envelope schema version 0")
    assert Run.objects.get(pk=run.pk).version == version + 1  # queued commands are stale


@pytest.fixture
def deploy_without_extract_claims():
    """deploy() swaps in a research@1 whose code no longer has the extract_claims step
    (the stored definition stays as it was); the original code returns afterwards."""
    original = workflow_code("research", "1")

    def deploy() -> Workflow:
        shrunk = Workflow("research", version="1", code_version="1-shrunk", register=False)
        for state in original.states:
            if state in original.steps and state != "extract_claims":
                spec = original.steps[state]
                shrunk.add_step(state, spec.fn, next=spec.next, name=spec.name)
            elif state in original.approvals:
                a = original.approvals[state]
                shrunk.approval(state, next=a.next, rejected=a.rejected, artifact=a.artifact)
            else:
                shrunk.terminal(state)
        registry_add(shrunk)
        return shrunk

    yield deploy
    registry_add(original)


def test_a_checkpoint_naming_a_step_the_code_no_longer_has_pauses_the_run(
    acme, settings, deploy_without_extract_claims
):
    run = _stop_after_first_step(acme, settings)  # at extract_claims
    deploy_without_extract_claims()
    assert advance(run) == "paused"
    _assert_paused_without_a_new_checkpoint(
        run,
        2,
        "checkpoint 2 is at state 'extract_claims', which the workflow code research@1 "
        "(code version 1-shrunk) no longer has a step for",
    )


def test_a_checkpoint_whose_stored_hash_does_not_match_pauses_the_run(acme, settings):
    run = _stop_after_first_step(acme, settings)
    envelope = _v1_from(envelope_at(run, 2))
    checkpoint_write_raw(run, envelope, state="extract_claims", schema_version=1, sha256="0" * 64)
    assert advance(run) == "paused"
    _assert_paused_without_a_new_checkpoint(run, 3, "does not match its sha256")


def test_a_damaged_evidence_artifact_pauses_the_run(acme, settings):
    run = _stop_after_first_step(acme, settings)
    ref = envelope_at(run, 2)["evidence"]["artifacts"][0]
    artifact = Artifact.objects.get(pk=ref["id"])
    default_storage.delete(artifact.storage_name)
    with default_storage.open(artifact.storage_name, "wb") as handle:
        handle.write(b"not what was stored")
    assert advance(run) == "paused"
    _assert_paused_without_a_new_checkpoint(run, 2, f"evidence artifact '{ref['name']}'")
