"""Models that changed app keep working on an existing database.

The metrics rows moved from retention to telemetry, the artifact references and compaction
records from retention to the store, all in Django's state only. These tests take the
database back to the migrations before the move, write rows through the models as they were
then, migrate forward and read the same rows through today's models; and check that the
tables the state describes are the tables the database holds.
"""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Permission
from django.contrib.contenttypes.models import ContentType
from django.db import IntegrityError, connection, transaction
from django.db.migrations.executor import MigrationExecutor
from django.db.models import ProtectedError

from checkpoints.models import (
    Artifact,
    ArtifactReference,
    Checkpoint,
    CompactionReason,
    CompactionRecord,
    RunStatus,
)
from checkpoints.services.compaction import compaction_index
from retention.models import RetentionPolicy
from retention.policies import PolicyInput, retention_policy_delete, retention_policy_save
from telemetry.counters import counter_values
from telemetry.models import CommitLatencySample, MetricIncrement, MetricTotal
from tenants.services import Actor
from tests.retention_support import artifact, build

pytestmark = pytest.mark.django_db(transaction=True)

ADMIN = Actor.system("test-admin")
# The migration state main had before the models moved.
BEFORE = [
    ("retention", "0002_backfill_artifact_references"),
    ("checkpoints", "0007_operation_job_runner_webhook"),
    ("telemetry", None),
]
MOVED = {
    "telemetry": (MetricTotal, MetricIncrement, CommitLatencySample),
    "checkpoints": (ArtifactReference, CompactionRecord),
}


def _migrate(targets) -> MigrationExecutor:  # noqa: ANN001
    MigrationExecutor(connection).migrate(targets)
    ContentType.objects.clear_cache()
    return MigrationExecutor(connection)


def _latest() -> None:
    _migrate(MigrationExecutor(connection).loader.graph.leaf_nodes())


@pytest.fixture
def back_to_before_the_move(transactional_db):  # noqa: ANN001, ANN201
    """Migrates the database back to the state before the move and returns that state's
    models; afterwards the database is migrated forward again, whatever the test did."""

    def back():  # noqa: ANN202
        nodes = [target for target in BEFORE if target[1] is not None]
        return _migrate(BEFORE).loader.project_state(nodes).apps

    yield back
    _latest()


def test_rows_written_before_the_move_are_read_by_the_moved_models(
    back_to_before_the_move, acme, bob, workflow
):  # noqa: ANN001
    history = build(acme, bob, status=RunStatus.SUCCEEDED, length=4, evidence=(), context_at=None)
    second = Checkpoint.objects.get(run=history.run, sequence=2)
    pinned = artifact(acme, b"named by checkpoint 2, written by the old model")
    policy = retention_policy_save(tenant=acme, data=PolicyInput(intermediate_days=30), actor=ADMIN)

    old = back_to_before_the_move()
    old_ref = old.get_model("retention", "ArtifactReference").objects.create(
        tenant_id=acme.pk, checkpoint_id=second.pk, artifact_id=pinned.pk
    )
    removed = [{"sequence": 2, "sha256": second.sha256, "parent_sha256": second.parent_sha256}]
    old_record = old.get_model("retention", "CompactionRecord").objects.create(
        tenant_id=acme.pk,
        run_id=history.run.pk,
        policy_id=policy.pk,
        policy_label="acme/default",
        reason="intermediate",
        first_sequence=2,
        last_sequence=2,
        removed=removed,
    )
    old.get_model("retention", "MetricTotal").objects.create(
        name="cairn_moved_total", labels='kind="old"', value=2
    )
    old.get_model("retention", "MetricIncrement").objects.create(
        name="cairn_moved_total", labels='kind="old"', value=3
    )
    old_sample = old.get_model("retention", "CommitLatencySample").objects.create(seconds=0.0421)

    _latest()

    ref = ArtifactReference.objects.get(pk=old_ref.pk)
    assert (ref.checkpoint_id, ref.artifact_id, ref.tenant_id) == (second.pk, pinned.pk, acme.pk)
    record = CompactionRecord.objects.get(pk=old_record.pk)
    assert record.policy_id == policy.pk
    assert record.reason == CompactionReason.INTERMEDIATE
    assert list(history.run.compactions.all()) == [record]
    assert set(compaction_index(history.run).entries) == {2}
    assert counter_values("cairn_moved_total") == {'kind="old"': 5.0}
    assert CommitLatencySample.objects.get(pk=old_sample.pk).seconds == 0.0421

    # The relations the moved models declare are the database's: the artifact is protected,
    # and the policy a compaction record names cannot go behind retention's back.
    with pytest.raises(ProtectedError):
        Artifact.objects.filter(pk=pinned.pk).delete()
    with pytest.raises(IntegrityError), transaction.atomic():
        RetentionPolicy.objects.filter(pk=policy.pk).delete()
    assert retention_policy_delete(tenant=acme, workflow_type="", actor=ADMIN)
    record.refresh_from_db()
    assert (record.policy_id, record.policy_label) == (None, "acme/default")


def test_content_types_follow_the_models_both_ways(back_to_before_the_move):  # noqa: ANN001
    """Permissions (and anything else pointing at a content type) keep their row: the row
    is relabelled, never recreated."""
    back_to_before_the_move()
    models = [model for group in MOVED.values() for model in group]
    names = [model._meta.model_name for model in models]
    before = dict(
        ContentType.objects.filter(app_label="retention", model__in=names).values_list(
            "model", "pk"
        )
    )
    assert sorted(before) == sorted(names)
    permissions = dict(
        Permission.objects.filter(content_type__in=before.values()).values_list("codename", "pk")
    )
    assert permissions

    _latest()

    for model in models:
        content_type = ContentType.objects.get_for_model(model)
        assert content_type.pk == before[model._meta.model_name]
        assert content_type.app_label == model._meta.app_label
    assert not ContentType.objects.filter(app_label="retention", model__in=names).exists()
    for codename, pk in permissions.items():
        assert Permission.objects.get(pk=pk).codename == codename


def test_the_tables_the_moved_models_describe_are_the_tables_the_database_holds(db):  # noqa: ANN001
    with connection.cursor() as cursor:
        for app_label, models in MOVED.items():
            for model in models:
                assert model._meta.app_label == app_label
                table = model._meta.db_table
                assert table.startswith("retention_"), "the tables keep their names"
                columns = {
                    c.name for c in connection.introspection.get_table_description(cursor, table)
                }
                assert columns == {field.column for field in model._meta.local_fields}, table
                found = connection.introspection.get_constraints(cursor, table)
                named = [i.name for i in model._meta.indexes]
                named += [c.name for c in model._meta.constraints]
                assert set(named) <= set(found), table
                keys = {
                    tuple(c["columns"]): c["foreign_key"]
                    for c in found.values()
                    if c["foreign_key"]
                }
                for field in model._meta.local_fields:
                    if field.is_relation:
                        target = field.related_model._meta.db_table
                        assert keys[(field.column,)][0] == target, (table, field.name)
    with connection.cursor() as cursor:
        found = connection.introspection.get_constraints(cursor, CompactionRecord._meta.db_table)
    keys = {tuple(c["columns"]): c["foreign_key"] for c in found.values() if c["foreign_key"]}
    assert keys[("policy_id",)][0] == RetentionPolicy._meta.db_table
