"""Retention against real PostgreSQL: the immutability trigger, a job killed mid-batch, two
jobs at once, and active runs committing while a job holds a batch open."""

from __future__ import annotations

import signal
import time
from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.utils import timezone

from checkpoints.models import Artifact, Checkpoint, Run, RunStatus
from checkpoints.services.checkpoints import checkpoint_commit, run_verify
from retention.models import CompactionRecord, MetricIncrement, PendingFileDeletion
from retention.policies import PolicyInput, legal_hold_set, retention_policy_save
from retention.services import DELETED, retention_apply
from tenants.services import Actor
from tests.retention_support import build, start_job

pytestmark = pytest.mark.postgres

ADMIN = Actor.system("test-admin")
APP = "cairn-retention-test"


def _backends_gone(app_name: str) -> None:
    """Wait until no server backend of ``app_name`` remains (a killed client's backend
    lingers until the server notices the closed socket); its locks go with it."""
    for _ in range(600):
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s", [app_name]
            )
            if cursor.fetchone()[0] == 0:
                return
        time.sleep(0.05)
    raise AssertionError(f"backend {app_name} still present")


def _wait_in_transaction(app_name: str) -> None:
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


@pytest.fixture
def estate(postgres_only, acme, bob, workflow):  # noqa: ANN001, ANN201
    """A run in every status, a held terminal run, old artifacts, a policy."""
    histories = {}
    for status in RunStatus.values:
        histories[status] = build(acme, bob, status=status, length=10, evidence=(4, 7))
    held = build(acme, bob, status=RunStatus.SUCCEEDED, length=10)
    legal_hold_set(tenant=acme, run_id=held.run.id, on=True, actor=ADMIN)
    histories["held"] = held
    Artifact.objects.update(created_at=timezone.now() - timedelta(days=40))
    retention_policy_save(
        tenant=acme,
        data=PolicyInput(intermediate_days=30, model_context_days=7),
        actor=ADMIN,
    )
    return histories


def _expected(history, key: str) -> set[int]:  # noqa: ANN001
    if history.run.status in (RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.CANCELLED) and (
        key != "held"
    ):
        return history.kept_when_compacted
    return set(range(1, history.length + 1))


def _assert_nothing_kept_was_lost(acme, estate, *, finished: bool) -> None:  # noqa: ANN001
    for key, history in estate.items():
        expected = _expected(history, key)
        if finished:
            assert history.sequences() == expected, key
        else:
            assert expected <= history.sequences(), key
        result = run_verify(tenant=acme, run_id=history.run.id)
        assert result["ok"], (key, result["problems"])
        assert Artifact.objects.filter(pk=history.artifacts["draft"].pk).exists(), key


def _assert_each_removal_recorded_once(estate) -> None:  # noqa: ANN001
    removed = list(CompactionRecord.objects.values_list("run_id", "removed"))
    seen = [(run_id, entry["sequence"]) for run_id, entries in removed for entry in entries]
    assert len(seen) == len(set(seen)), "a checkpoint was recorded as removed twice"
    counted = sum(
        MetricIncrement.objects.filter(name=DELETED, labels='kind="checkpoint"').values_list(
            "value", flat=True
        )
    )
    total = sum(h.length - len(_expected(h, k)) for k, h in estate.items())
    assert len(seen) == counted == total


def test_every_status_on_postgres_keeps_what_must_stay(acme, estate):
    report = retention_apply()
    _assert_nothing_kept_was_lost(acme, estate, finished=True)
    _assert_each_removal_recorded_once(estate)
    contexts = [
        h.artifacts["context"].pk
        for k, h in estate.items()
        if _expected(h, k) != set(range(1, h.length + 1))
    ]
    assert not Artifact.objects.filter(pk__in=contexts).exists()
    assert report.artifacts == len(contexts)


def test_a_delete_outside_the_job_is_still_refused_by_the_trigger(acme, estate):
    from django.db import DatabaseError

    retention_apply()
    with pytest.raises(DatabaseError), transaction.atomic():
        Checkpoint.objects.filter(run=estate["succeeded"].run).retention_delete()


def test_a_job_killed_mid_batch_then_rerun_loses_nothing_it_should_keep(acme, estate):
    job = start_job("--batch-size", "2", pause=0.3, app_name=APP)
    progressed = 0
    while progressed < 3:
        line = job.stdout.readline()
        assert line, f"the job ended early: {job.stderr.read()}"
        progressed += "removed checkpoints" in line
    job.send_signal(signal.SIGKILL)
    job.wait(timeout=60)
    job.stdout.close()
    job.stderr.close()
    _backends_gone(APP)
    _assert_nothing_kept_was_lost(acme, estate, finished=False)
    assert 0 < CompactionRecord.objects.count()
    retention_apply()
    _assert_nothing_kept_was_lost(acme, estate, finished=True)
    _assert_each_removal_recorded_once(estate)
    assert not PendingFileDeletion.objects.exists()


def test_two_jobs_at_once_lose_nothing_and_delete_nothing_twice(acme, estate):
    jobs = [start_job("--batch-size", "2", pause=0.0, app_name=f"{APP}-{n}") for n in (1, 2)]
    summaries = []
    for job in jobs:
        out, err = job.communicate(timeout=240)
        assert job.returncode == 0, err
        summaries.append(out.splitlines()[-1])
    _assert_nothing_kept_was_lost(acme, estate, finished=True)
    _assert_each_removal_recorded_once(estate)
    removed = [int(line.split("removed ")[1].split(" ")[0]) for line in summaries]
    assert sum(removed) == sum(h.length - len(_expected(h, k)) for k, h in estate.items())


def test_active_runs_commit_while_a_job_holds_a_batch_open(acme, bob, estate):
    job = start_job("--batch-size", "1", pause=30, app_name=APP)
    try:
        _wait_in_transaction(APP)
        with connection.cursor() as cursor:
            # Fails fast instead of waiting if the job held any lock this commit needs.
            cursor.execute("SET lock_timeout = '2s'")
        for status in (RunStatus.RUNNING, RunStatus.WAITING_RETRY):
            run = Run.objects.get(pk=estate[status].run.pk)
            checkpoint_commit(
                tenant=acme,
                run_id=run.id,
                expected_version=run.version,
                state="collect_sources",
                step="more",
                envelope={},
                actor=Actor(user=bob),
            )
        assert estate[RunStatus.RUNNING].sequences() == set(range(1, 12))
    finally:
        with connection.cursor() as cursor:
            cursor.execute("SET lock_timeout = 0")
        job.send_signal(signal.SIGKILL)
        job.wait(timeout=60)
        job.stdout.close()
        job.stderr.close()
        _backends_gone(APP)
