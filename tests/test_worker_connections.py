"""A worker process keeps its database connection from task to task: Celery's Django fixup
would close it around every task, and each run.resume would pay a new PostgreSQL connection
and prepare the commit statement again (docs/performance.md)."""

from __future__ import annotations

import time

import pytest
from django.db import connection

import tests.runtime_workflows  # noqa: F401 - declares noop_six
from checkpoints.models import Run, RunStatus
from runtime.registry import workflows_sync
from runtime.services.runs import run_create
from tenants.services import Actor
from tests.worker_fixtures import wait_for

pytestmark = [pytest.mark.worker, pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


def _sessions_opened() -> int:
    """Connections ever opened to this test database (PostgreSQL's cumulative statistics;
    a backend reports its connection within a second, or when it ends)."""
    time.sleep(1.5)
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_clear_snapshot()")
        cursor.execute("SELECT sessions FROM pg_stat_database WHERE datname = current_database()")
        return cursor.fetchone()[0]


def _run_to_the_end(tenant) -> None:  # noqa: ANN001
    run = run_create(
        tenant=tenant, workflow_type="noop_six", execution="worker", actor=Actor.system("test")
    )
    wait_for(
        lambda: Run.objects.filter(pk=run.pk, status=RunStatus.SUCCEEDED, lease_owner="").exists(),
        what=f"run {run.pk} to succeed",
    )


def test_a_worker_reuses_its_database_connection_across_tasks(postgres_only, acme, worker_factory):
    workflows_sync()
    worker_factory("w1")
    _run_to_the_end(acme)  # the worker has connected
    before = _sessions_opened()
    for _ in range(5):
        _run_to_the_end(acme)
    # Five tasks (and this test's own polling on its one connection): no new connection.
    # With a connection per task the count grows by at least five.
    assert _sessions_opened() - before == 0
