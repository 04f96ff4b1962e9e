"""On PostgreSQL the database itself refuses to change or delete a checkpoint."""

from __future__ import annotations

import pytest
from django.db import DatabaseError, connection, transaction

from checkpoints.models import Checkpoint
from runtime.services.runs import run_create
from tenants.services import Actor

pytestmark = pytest.mark.postgres


def test_the_trigger_refuses_update_and_delete(postgres_only, run):
    table = Checkpoint._meta.db_table
    for statement in (f"UPDATE {table} SET state = 'forged'", f"DELETE FROM {table}"):
        with pytest.raises(DatabaseError, match="checkpoints are"), transaction.atomic():
            with connection.cursor() as cursor:
                cursor.execute(statement)
    assert Checkpoint.objects.get(run=run).state == "collect_sources"


def test_rotation_mode_may_rewrite_only_the_ciphertext(postgres_only, run):
    table = Checkpoint._meta.db_table
    with pytest.raises(DatabaseError), transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("SET LOCAL cairn.rotation = 'on'")
            cursor.execute(f"UPDATE {table} SET state = 'forged'")
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET LOCAL cairn.rotation = 'on'")
        cursor.execute(f"UPDATE {table} SET key_id = key_id")
    assert Checkpoint.objects.get(run=run).state == "collect_sources"


def test_retention_mode_may_delete(postgres_only, run, bob):
    other = run_create(
        tenant=run.tenant, workflow_type="research", execution="external", actor=Actor(user=bob)
    )
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET LOCAL cairn.retention = 'on'")
        Checkpoint.objects.filter(run=run).retention_delete()
    assert not Checkpoint.objects.filter(run=run).exists()
    # The setting was local to that transaction: deletes are refused again.
    with pytest.raises(DatabaseError), transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute(f"DELETE FROM {Checkpoint._meta.db_table}")
    assert Checkpoint.objects.filter(run=other).count() == 1
