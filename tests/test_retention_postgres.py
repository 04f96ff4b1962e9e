"""Retention against real PostgreSQL: runs in every status, the immutability trigger, a
job killed mid-batch, two jobs at once, and active runs committing while a job holds a
batch open."""

from __future__ import annotations

import signal
import time

import pytest
from django.db import DatabaseError, connection, transaction

from checkpoints.models import Artifact, Checkpoint, Run, RunStatus
from checkpoints.services.checkpoints import CommitRequest, checkpoint_commit
from retention.services import retention_apply
from tenants.services import Actor
from tests import retention_jobs as jobs
from tests.retention_support import start_job

pytestmark = pytest.mark.postgres


@pytest.fixture
def estate(postgres_only, acme, bob, workflow):  # noqa: ANN001, ANN201
    return jobs.make_estate(acme, bob)


def _wait_in_transaction(app_name: str) -> None:
    """Until the job's backend has sat inside an open transaction for half a second."""
    for _ in range(1200):
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s "
                "AND state = 'idle in transaction' "
                "AND now() - state_change > interval '0.5 seconds'",
                [app_name],
            )
            if cursor.fetchone()[0]:
                return
        time.sleep(0.05)
    raise AssertionError("the job never opened a batch")


def test_every_status_on_postgres_keeps_what_must_stay(acme, estate):
    report = retention_apply()
    jobs.assert_nothing_kept_was_lost(acme, estate, finished=True)
    jobs.assert_each_removal_recorded_once(estate)
    contexts = [
        h.artifacts["context"].pk
        for k, h in estate.items()
        if jobs.expected(h, k) != set(range(1, h.length + 1))
    ]
    assert not Artifact.objects.filter(pk__in=contexts).exists()
    assert report.artifacts == len(contexts)


def test_a_delete_outside_the_job_is_still_refused_by_the_trigger(acme, estate):
    retention_apply()
    with pytest.raises(DatabaseError), transaction.atomic():
        Checkpoint.objects.filter(run=estate["succeeded"].run).retention_delete()


def test_a_job_killed_mid_batch_then_rerun_loses_nothing_it_should_keep(acme, estate):
    jobs.kill_mid_job_then_rerun(acme, estate)


def test_two_jobs_at_once_lose_nothing_and_delete_nothing_twice(acme, estate):
    jobs.two_jobs_at_once(acme, estate)


def test_active_runs_commit_while_a_job_holds_a_batch_open(acme, bob, estate):
    job = start_job("--batch-size", "1", pause=30, app_name=jobs.APP)
    try:
        _wait_in_transaction(jobs.APP)
        with connection.cursor() as cursor:
            # Fails fast instead of waiting if the job held any lock this commit needs.
            cursor.execute("SET lock_timeout = '2s'")
        for status in (RunStatus.RUNNING, RunStatus.WAITING_RETRY):
            run = Run.objects.get(pk=estate[status].run.pk)
            checkpoint_commit(
                tenant=acme,
                run_id=run.id,
                request=CommitRequest(
                    expected_version=run.version,
                    state="collect_sources",
                    step="more",
                    envelope={},
                    actor=Actor(user=bob),
                ),
            )
        assert estate[RunStatus.RUNNING].sequences() == set(range(1, 12))
    finally:
        with connection.cursor() as cursor:
            cursor.execute("SET lock_timeout = 0")
        job.send_signal(signal.SIGKILL)
        job.wait(timeout=60)
        job.stdout.close()
        job.stderr.close()
        jobs.backends_gone(jobs.APP)
