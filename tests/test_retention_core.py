"""Retention on the default database (SQLite locally, PostgreSQL in CI): what goes, what
stays, the chain after compaction, holds, artifacts, expiry, preview and the command."""

from __future__ import annotations

import io
from datetime import timedelta

import pytest
from django.core.files.storage import default_storage
from django.core.management import call_command
from django.utils import timezone

from cairn.errors import ArtifactHashMismatch, InvalidRequest, NotFound
from checkpoints.models import (
    ACTIVE_STATUSES,
    Artifact,
    ArtifactKind,
    ArtifactReference,
    Checkpoint,
    CompactionRecord,
    Run,
    RunStatus,
)
from checkpoints.services.checkpoints import CommitRequest, checkpoint_commit
from checkpoints.services.integrity import run_verify
from retention.models import RetentionPolicy
from retention.policies import (
    PolicyInput,
    legal_hold_set,
    policy_build,
    retention_policy_delete,
    retention_policy_save,
)
from retention.services import retention_apply, retention_preview
from runtime.services.forks import run_fork
from tenants.models import AuditEvent
from tenants.services import Actor
from tests.retention_support import artifact, build, ref

pytestmark = pytest.mark.django_db

ADMIN = Actor.system("test-admin")


def policy(tenant, **periods):  # noqa: ANN001, ANN003, ANN201
    return retention_policy_save(tenant=tenant, data=PolicyInput(**periods), actor=ADMIN)


@pytest.fixture
def every_status(acme, bob, workflow):  # noqa: ANN001, ANN201
    return {status: build(acme, bob, status=status) for status in RunStatus.values}


def test_compaction_keeps_final_evidence_and_every_active_run(acme, every_status):
    policy(acme, intermediate_days=30)
    report = retention_apply()
    for status, history in every_status.items():
        if status in ACTIVE_STATUSES:
            assert history.sequences() == set(range(1, 9)), status
        else:
            assert history.sequences() == history.kept_when_compacted, status
    assert report.checkpoints == 3 * 5
    assert report.runs_compacted == 3


def test_verify_passes_after_compaction_and_says_what_was_compacted(acme, every_status):
    policy(acme, intermediate_days=30)
    retention_apply()
    for status, history in every_status.items():
        result = run_verify(tenant=acme, run_id=history.run.id)
        assert result["ok"], (status, result["problems"])
        assert result["checkpoints"] == len(history.sequences())
    compacted = run_verify(tenant=acme, run_id=every_status["succeeded"].run.id)["compacted"]
    assert [(c["from"], c["to"]) for c in compacted] == [(2, 3), (5, 7)]
    assert {c["policy"] for c in compacted} == {"acme/default"}
    assert all(c["reason"] == "intermediate" and c["compacted_at"] for c in compacted)


def test_compaction_records_hold_the_removed_hashes(acme, every_status):
    history = every_status["cancelled"]
    before = {
        c.sequence: (c.sha256, c.parent_sha256) for c in Checkpoint.objects.filter(run=history.run)
    }
    policy(acme, intermediate_days=30)
    retention_apply()
    removed = [
        entry
        for record in CompactionRecord.objects.filter(run=history.run)
        for entry in record.removed
    ]
    assert {e["sequence"]: (e["sha256"], e["parent_sha256"]) for e in removed} == {
        s: before[s] for s in (2, 3, 5, 6, 7)
    }


@pytest.mark.django_db(transaction=True)
def test_removing_a_policy_keeps_what_it_compacted_under_its_name(acme, bob, workflow):
    # Committed for real: the database's foreign key from the records to the policy is
    # checked at commit, which a rolled-back test transaction never reaches.
    history = build(acme, bob, status=RunStatus.SUCCEEDED)
    saved = policy(acme, intermediate_days=30)
    retention_apply()
    assert set(CompactionRecord.objects.values_list("policy_id", flat=True)) == {saved.pk}
    assert retention_policy_delete(tenant=acme, workflow_type="", actor=ADMIN)
    assert not RetentionPolicy.objects.filter(pk=saved.pk).exists()
    assert set(CompactionRecord.objects.values_list("policy_id", "policy_label")) == {
        (None, "acme/default")
    }
    result = run_verify(tenant=acme, run_id=history.run.id)
    assert result["ok"], result["problems"]
    assert {c["policy"] for c in result["compacted"]} == {"acme/default"}


def test_an_unexplained_gap_or_a_forged_record_still_fails_verify(acme, every_status):
    history = every_status["succeeded"]
    policy(acme, intermediate_days=30)
    retention_apply()
    record = CompactionRecord.objects.filter(run=history.run).order_by("first_sequence").last()
    forged = [dict(entry) for entry in record.removed]
    next(entry for entry in forged if entry["sequence"] == 6)["sha256"] = "0" * 64
    CompactionRecord.objects.filter(pk=record.pk).update(removed=forged)
    result = run_verify(tenant=acme, run_id=history.run.id)
    assert not result["ok"]
    assert any("compacted checkpoint 7 names parent hash" in p for p in result["problems"])
    CompactionRecord.objects.filter(pk=record.pk).delete()
    result = run_verify(tenant=acme, run_id=history.run.id)
    assert any("gap (checkpoints 5–7) that no compaction explains" in p for p in result["problems"])


def test_a_run_that_ended_recently_keeps_its_history(acme, bob, workflow):
    recent = build(acme, bob, status=RunStatus.SUCCEEDED, ended_days_ago=5)
    policy(acme, intermediate_days=30)
    retention_apply()
    assert recent.sequences() == set(range(1, 9))


def test_failed_runs_keep_their_full_history_longer(acme, bob, workflow):
    failed = build(acme, bob, status=RunStatus.FAILED, ended_days_ago=40)
    succeeded = build(acme, bob, status=RunStatus.SUCCEEDED, ended_days_ago=40)
    policy(acme, intermediate_days=30, failed_run_days=90)
    retention_apply()
    assert failed.sequences() == set(range(1, 9))
    assert succeeded.sequences() == succeeded.kept_when_compacted
    Run.objects.filter(pk=failed.run.pk).update(updated_at=timezone.now() - timedelta(days=100))
    retention_apply()
    assert failed.sequences() == failed.kept_when_compacted


def test_a_workflow_policy_overrides_the_default_for_its_runs(acme, bob, workflow):
    history = build(acme, bob, status=RunStatus.SUCCEEDED, ended_days_ago=40)
    policy(acme, intermediate_days=30)
    policy(acme, workflow_type="research", intermediate_days=60)
    retention_apply()
    assert history.sequences() == set(range(1, 9))


def test_no_policy_means_nothing_is_removed(acme, every_status):
    report = retention_apply()
    assert report.checkpoints == report.artifacts == 0
    assert Checkpoint.objects.count() == 8 * len(every_status)


def test_a_legal_hold_on_a_run_or_the_tenant_prevents_deletion(acme, bob, workflow):
    held = build(acme, bob, status=RunStatus.SUCCEEDED)
    free = build(acme, bob, status=RunStatus.SUCCEEDED)
    policy(acme, intermediate_days=30, model_context_days=1, run_expiry_days=30)
    legal_hold_set(tenant=acme, run_id=held.run.id, on=True, actor=ADMIN, reason="litigation")
    legal_hold_set(tenant=acme, on=True, actor=ADMIN, reason="audit")
    report = retention_apply()
    assert report.checkpoints == report.artifacts == report.runs_expired == 0
    assert held.sequences() == free.sequences() == set(range(1, 9))
    legal_hold_set(tenant=acme, on=False, actor=ADMIN)
    retention_apply()
    assert held.sequences() == set(range(1, 9))
    assert Artifact.objects.filter(pk=held.artifacts["context"].pk).exists()
    assert not Run.objects.filter(pk=free.run.pk).exists()
    actions = set(AuditEvent.objects.values_list("action", flat=True))
    assert {"retention.legal_hold_on", "retention.legal_hold_off"} <= actions


def test_an_artifact_goes_only_when_no_kept_checkpoint_references_it(acme, bob, workflow):
    history = build(acme, bob, status=RunStatus.SUCCEEDED)
    context, draft = history.artifacts["context"], history.artifacts["draft"]
    young = artifact(acme, b"fresh context", ArtifactKind.MODEL_CONTEXT)
    old_orphan = artifact(acme, b"old context", ArtifactKind.MODEL_CONTEXT)
    Artifact.objects.filter(pk=old_orphan.pk).update(created_at=timezone.now() - timedelta(days=9))
    Artifact.objects.filter(pk__in=[context.pk, draft.pk]).update(
        created_at=timezone.now() - timedelta(days=40)
    )
    policy(acme, intermediate_days=30, model_context_days=7)
    report = retention_apply()
    remaining = set(Artifact.objects.values_list("pk", flat=True))
    assert context.pk not in remaining and old_orphan.pk not in remaining
    assert {draft.pk, young.pk} <= remaining  # the final checkpoint names the draft
    assert not default_storage.exists(context.storage_name)
    assert default_storage.exists(draft.storage_name)
    assert report.artifacts == 2 and report.files == 2
    assert run_verify(tenant=acme, run_id=history.run.id)["ok"]


def test_an_active_runs_artifact_is_never_removed(acme, bob, workflow):
    history = build(acme, bob, status=RunStatus.RUNNING)
    Artifact.objects.update(created_at=timezone.now() - timedelta(days=400))
    policy(acme, intermediate_days=30, model_context_days=1)
    retention_apply()
    assert Artifact.objects.filter(pk=history.artifacts["context"].pk).exists()


def test_the_source_of_a_fork_is_kept_and_a_forked_run_does_not_expire(acme, bob, workflow):
    source = build(acme, bob, status=RunStatus.RUNNING)
    fork = run_fork(
        tenant=acme,
        run_id=source.run.id,
        from_sequence=5,
        reason="try again",
        actor=Actor(user=bob),
    )
    Run.objects.filter(pk=source.run.pk).update(
        status=RunStatus.FAILED, updated_at=timezone.now() - timedelta(days=400)
    )
    policy(acme, intermediate_days=30, run_expiry_days=100)
    retention_apply()
    assert Run.objects.filter(pk=source.run.pk).exists()
    assert source.sequences() == source.kept_when_compacted | {5}
    assert run_verify(tenant=acme, run_id=fork.run.id)["ok"]


def test_an_expired_run_is_deleted_with_everything_of_it(acme, bob, workflow):
    old = build(acme, bob, status=RunStatus.SUCCEEDED, ended_days_ago=400)
    kept = build(acme, bob, status=RunStatus.SUCCEEDED, ended_days_ago=40)
    policy(acme, intermediate_days=30, run_expiry_days=365)
    report = retention_apply(batch_size=3)
    assert not Run.objects.filter(pk=old.run.pk).exists()
    assert not Checkpoint.objects.filter(run_id=old.run.pk).exists()
    assert not ArtifactReference.objects.filter(checkpoint__run_id=old.run.pk).exists()
    assert kept.sequences() == kept.kept_when_compacted
    assert report.runs_expired == 1
    expired = AuditEvent.objects.get(action="retention.run_expired")
    assert expired.run_id == old.run.id and expired.details["checkpoints"] == 8


def test_the_preview_counts_what_the_job_then_removes(acme, bob, workflow, every_status):
    build(acme, bob, status=RunStatus.FAILED, ended_days_ago=400)
    Artifact.objects.update(created_at=timezone.now() - timedelta(days=40))
    draft = policy_build(
        tenant=acme,
        data=PolicyInput(intermediate_days=30, model_context_days=7, run_expiry_days=365),
    )
    preview = retention_preview(draft)
    assert draft.pk is None and RetentionPolicy.objects.count() == 0  # nothing saved
    before = Checkpoint.objects.count()
    dry = retention_apply(dry_run=True)
    assert (dry.checkpoints, dry.artifacts) == (0, 0)  # no saved policy yet
    retention_policy_save(
        tenant=acme,
        data=PolicyInput(intermediate_days=30, model_context_days=7, run_expiry_days=365),
        actor=ADMIN,
    )
    dry = retention_apply(dry_run=True)
    assert Checkpoint.objects.count() == before  # a dry run deletes nothing
    report = retention_apply()
    assert (
        preview.checkpoints
        == dry.checkpoints
        == report.checkpoints
        == before - (Checkpoint.objects.count())
    )
    assert preview.artifacts == dry.artifacts == report.artifacts == 3 + 1 + 1
    assert preview.bytes == dry.bytes == report.bytes > 0
    assert (preview.runs_compacted, preview.runs_expired) == (3, 1)


def test_running_the_job_twice_removes_nothing_more(acme, every_status):
    policy(acme, intermediate_days=30, model_context_days=7)
    retention_apply()
    counts = (Checkpoint.objects.count(), Artifact.objects.count())
    again = retention_apply()
    assert (again.checkpoints, again.artifacts) == (0, 0)
    assert (Checkpoint.objects.count(), Artifact.objects.count()) == counts


def test_commits_index_the_artifacts_they_name(acme, run, bob):
    draft = artifact(acme, b"a draft")
    checkpoint_commit(
        tenant=acme,
        run_id=run.id,
        request=CommitRequest(
            expected_version=1,
            state="draft_answer",
            step="draft",
            envelope={"evidence": {"artifacts": [ref(draft)], "validators": []}},
            actor=Actor(user=bob),
        ),
    )
    assert list(ArtifactReference.objects.values_list("checkpoint__sequence", "artifact")) == [
        (2, draft.pk)
    ]


def test_a_commit_naming_a_deleted_artifact_is_refused_whole(acme, run, bob):
    draft = artifact(acme, b"a draft")
    Artifact.objects.filter(pk=draft.pk).delete()
    with pytest.raises(ArtifactHashMismatch):
        checkpoint_commit(
            tenant=acme,
            run_id=run.id,
            request=CommitRequest(
                expected_version=1,
                state="draft_answer",
                envelope={"evidence": {"artifacts": [ref(draft)], "validators": []}},
                actor=Actor(user=bob),
            ),
        )
    assert Checkpoint.objects.filter(run=run).count() == 1


def test_contradicting_periods_are_refused_with_the_fields_named(acme):
    with pytest.raises(InvalidRequest) as caught:
        policy(acme, intermediate_days=30, failed_run_days=10)
    assert "failed_run_days" in caught.value.fields
    with pytest.raises(InvalidRequest) as caught:
        policy(acme, intermediate_days=30, run_expiry_days=7)
    assert "run_expiry_days" in caught.value.fields
    with pytest.raises(InvalidRequest) as caught:
        policy(acme, intermediate_days=0)
    assert "intermediate_days" in caught.value.fields
    assert not RetentionPolicy.objects.exists()


def test_saving_a_policy_is_audited_and_replaces_the_previous(acme):
    policy(acme, intermediate_days=30)
    policy(acme, intermediate_days=60)
    assert RetentionPolicy.objects.get(tenant=acme).intermediate_days == 60
    event = AuditEvent.objects.filter(action="retention.policy_set").first()
    assert event.details["before"]["intermediate_days"] == 30


def test_a_legal_hold_on_another_tenants_run_is_refused(acme, globex, bob, workflow):
    history = build(acme, bob, status=RunStatus.SUCCEEDED)
    with pytest.raises(NotFound):
        legal_hold_set(tenant=globex, run_id=history.run.id, on=True, actor=ADMIN)
    assert not Run.objects.get(pk=history.run.pk).legal_hold


def test_the_command_prints_progress_and_a_summary(acme, every_status):
    policy(acme, intermediate_days=30)
    out = io.StringIO()
    call_command("apply_retention", "--dry-run", stdout=out)
    assert "would remove 15 checkpoints" in out.getvalue()
    out = io.StringIO()
    call_command("apply_retention", "--batch-size", "2", stdout=out)
    lines = out.getvalue().splitlines()
    assert sum("removed checkpoints" in line for line in lines) >= 6
    assert "Retention removed 15 checkpoints" in lines[-1]


def test_the_migration_backfills_the_reference_index(acme, bob, workflow):
    import importlib

    from django.db import connection
    from django.db.migrations.loader import MigrationLoader

    # The migration runs against the models as they were at that point of the history.
    node = ("retention", "0002_backfill_artifact_references")
    apps = MigrationLoader(connection).project_state(node).apps
    history = build(acme, bob, status=RunStatus.SUCCEEDED)
    expected = set(ArtifactReference.objects.values_list("checkpoint_id", "artifact_id"))
    assert len(expected) == 2  # the context (checkpoint 3) and the draft (the final one)
    ArtifactReference.objects.all().delete()
    migration = importlib.import_module("retention.migrations.0002_backfill_artifact_references")
    migration.backfill(apps, None)
    assert set(ArtifactReference.objects.values_list("checkpoint_id", "artifact_id")) == expected
    assert history.artifacts["draft"].pk in {a for _, a in expected}


def test_the_scheduler_runs_the_job_and_the_rollup():
    from django.conf import settings

    from cairn.celery import app

    app.loader.import_default_modules()
    tasks = {entry["task"] for entry in settings.CELERY_BEAT_SCHEDULE.values()}
    assert {"retention.apply", "observability.metrics_rollup"} <= tasks
    assert {"retention.apply", "observability.metrics_rollup"} <= set(app.tasks)
