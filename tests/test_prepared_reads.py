"""The hot reads and writes a worker's task and a run's start make before the first step
are prepared statements (``tenants.prepared``), and a row becomes the model instance the
ORM would have built: every field, converted as a queryset converts it, on either
database."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

import tests.runtime_workflows  # noqa: F401 - declares noop_six in this process
from cairn.errors import NotFound, UnknownWorkflow
from checkpoints.models import Checkpoint, Run, WorkflowDefinition
from checkpoints.services.reads import checkpoint_at, run_get, run_read
from checkpoints.services.workflows import workflow_register, workflow_resolve
from runtime.executor import run_advance
from runtime.registry import workflows_sync
from runtime.services.leases import lease_acquire
from runtime.services.runs import run_create
from tenants.services import Actor
from tests.factories import SIMPLE_DEFINITION

pytestmark = pytest.mark.django_db


def _fields(instance) -> dict:  # noqa: ANN001
    return {f.attname: getattr(instance, f.attname) for f in type(instance)._meta.concrete_fields}


def _varied_run(acme, bob):  # noqa: ANN001, ANN202
    run = run_create(
        tenant=acme,
        workflow_type="research",
        inputs={"question": "why?"},
        budget={"max_attempts": 7, "max_cost": 1.5},
        execution="external",
        actor=Actor(user=bob),
    )
    # Every kind of column: times, nulls, booleans, JSON, text with quotes.
    Run.objects.filter(pk=run.pk).update(
        next_eligible_at=timezone.now() + timedelta(seconds=90),
        lease_owner="w'1",
        lease_expires_at=timezone.now() + timedelta(seconds=30),
        budget_used={"attempts_used": 2, "tokens_used": 10, "cost_used": 0.25},
        paused=True,
        pause_reason='held "for" review',
        legal_hold=True,
    )
    return run


def test_a_prepared_read_builds_the_instance_the_orm_builds(acme, bob, workflow, globex):  # noqa: ANN001
    run = _varied_run(acme, bob)
    by_orm = Run.objects.select_related("workflow", "tenant").get(pk=run.pk)
    prepared = run_read(run_id=run.pk)
    assert _fields(prepared) == _fields(by_orm)
    assert _fields(prepared.workflow) == _fields(by_orm.workflow)
    assert _fields(prepared.tenant) == _fields(by_orm.tenant)
    assert not prepared._state.adding and prepared._state.db == "default"
    # It saves as one the ORM loaded would.
    prepared.pause_reason = "changed"
    prepared.save(update_fields=["pause_reason"])
    assert Run.objects.get(pk=run.pk).pause_reason == "changed"
    assert run_read(run_id=str(run.pk)).pk == run.pk and run_read(run_id="not-a-uuid") is None
    assert run_get(tenant=acme, run_id=run.pk).pk == run.pk
    checkpoint = Checkpoint.objects.get(run=run, sequence=1)
    assert _fields(checkpoint_at(run_id=run.pk, sequence=1)) == _fields(checkpoint)
    assert checkpoint_at(run_id=run.pk, sequence=2) is None
    resolved = workflow_resolve(tenant=acme, workflow_type="research", version="1")
    assert _fields(resolved) == _fields(WorkflowDefinition.objects.get(pk=workflow.pk))


def test_another_tenants_run_is_not_found_by_the_prepared_read(acme, bob, workflow, globex):  # noqa: ANN001
    run = _varied_run(acme, bob)
    with pytest.raises(NotFound):
        run_get(tenant=globex, run_id=run.pk)


def test_the_newest_workflow_version_is_resolved_and_the_tenants_own_is_visible(acme, globex):  # noqa: ANN001
    for version in ("1", "2"):
        workflow_register(
            tenant=acme, workflow_type="flow", version=version, definition=SIMPLE_DEFINITION
        )
    assert workflow_resolve(tenant=acme, workflow_type="flow").version == "2"
    assert workflow_resolve(tenant=acme, workflow_type="flow", version="1").version == "1"
    with pytest.raises(UnknownWorkflow):
        workflow_resolve(tenant=globex, workflow_type="flow")


def test_a_lease_returns_the_expiry_the_database_wrote(acme, bob, workflow):  # noqa: ANN001
    run = run_create(
        tenant=acme, workflow_type="research", execution="external", actor=Actor(user=bob)
    )
    lease = lease_acquire(
        tenant=acme, run_id=run.pk, owner="w1", ttl_seconds=30, expected_version=1, run=run
    )
    assert lease.expires_at == Run.objects.get(pk=run.pk).lease_expires_at
    assert not lease.took_over and lease.restore_count == 0


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_on_postgresql_a_task_takes_its_run_on_prepared_statements(
    postgres_only, acme, bob, settings
):  # noqa: ANN001
    settings.CAIRN_DISPATCH_ON_COMMIT = False
    workflows_sync()
    run = run_create(
        tenant=acme, workflow_type="noop_six", execution="worker", actor=Actor(user=bob)
    )
    assert run_advance(run_id=run.pk, expected_version=1, owner="w1") == "succeeded"
    prepared = {
        "the run read": "%JOIN tenants_tenant%",
        "the lease": "%RETURNING lease_expires_at%",
        "the checkpoint read": "%c.sequence = $2%",
        "the charge": "%budget_used = $1::jsonb%",
        "the workflow": "%w.workflow_type = $2%",
    }
    with connection.cursor() as cursor:
        for name, pattern in prepared.items():
            cursor.execute(
                "SELECT count(*) FROM pg_prepared_statements WHERE statement LIKE %s", [pattern]
            )
            assert cursor.fetchone()[0] >= 1, name
