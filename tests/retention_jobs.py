"""Retention job scenarios run as real processes, shared by the PostgreSQL tests and the
default-database tests: an estate of runs in every status, a job killed mid-batch then
rerun, two jobs at once, and the checks that nothing kept was lost."""

from __future__ import annotations

import signal
import time
from datetime import timedelta

from django.db import connection
from django.utils import timezone

from checkpoints.models import TERMINAL_STATUSES, Artifact, CompactionRecord, RunStatus
from checkpoints.services.integrity import run_verify
from retention.models import PendingFileDeletion
from retention.policies import PolicyInput, legal_hold_set, retention_policy_save
from retention.services import DELETED, retention_apply
from telemetry.models import MetricIncrement
from tenants.services import Actor
from tests.retention_support import History, build, start_job

ADMIN = Actor.system("test-admin")
APP = "cairn-retention-test"


def make_estate(acme, bob) -> dict[str, History]:  # noqa: ANN001
    """A run in every status, a held terminal run, old artifacts, a policy."""
    histories = {}
    for status in RunStatus.values:
        histories[status] = build(acme, bob, status=status, length=10, evidence=(4, 7))
    held = build(acme, bob, status=RunStatus.SUCCEEDED, length=10)
    legal_hold_set(tenant=acme, run_id=held.run.id, on=True, actor=ADMIN)
    histories["held"] = held
    Artifact.objects.update(created_at=timezone.now() - timedelta(days=40))
    retention_policy_save(
        tenant=acme, data=PolicyInput(intermediate_days=30, model_context_days=7), actor=ADMIN
    )
    return histories


def expected(history: History, key: str) -> set[int]:
    if history.run.status in TERMINAL_STATUSES and key != "held":
        return history.kept_when_compacted
    return set(range(1, history.length + 1))


def removable_total(estate: dict[str, History]) -> int:
    return sum(h.length - len(expected(h, k)) for k, h in estate.items())


def assert_nothing_kept_was_lost(acme, estate, *, finished: bool) -> None:  # noqa: ANN001
    for key, history in estate.items():
        wanted = expected(history, key)
        if finished:
            assert history.sequences() == wanted, key
        else:
            assert wanted <= history.sequences(), key
        result = run_verify(tenant=acme, run_id=history.run.id)
        assert result["ok"], (key, result["problems"])
        assert Artifact.objects.filter(pk=history.artifacts["draft"].pk).exists(), key


def assert_each_removal_recorded_once(estate) -> None:  # noqa: ANN001
    removed = list(CompactionRecord.objects.values_list("run_id", "removed"))
    seen = [(run_id, entry["sequence"]) for run_id, entries in removed for entry in entries]
    assert len(seen) == len(set(seen)), "a checkpoint was recorded as removed twice"
    counted = sum(
        MetricIncrement.objects.filter(name=DELETED, labels='kind="checkpoint"').values_list(
            "value", flat=True
        )
    )
    assert len(seen) == counted == removable_total(estate)


def backends_gone(app_name: str) -> None:
    """On PostgreSQL, wait until a killed client's server backend is gone (it lingers until
    the server notices the closed socket, and its locks go with it). SQLite's locks go with
    the process."""
    if connection.vendor != "postgresql":
        return
    for _ in range(600):
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s", [app_name]
            )
            if cursor.fetchone()[0] == 0:
                return
        time.sleep(0.05)
    raise AssertionError(f"backend {app_name} still present")


def kill_mid_job_then_rerun(acme, estate) -> None:  # noqa: ANN001
    """SIGKILL a job (tiny batches, pausing inside each transaction) after three batches,
    check nothing kept is lost and the chain verifies, rerun, check the final state."""
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
    backends_gone(APP)
    assert_nothing_kept_was_lost(acme, estate, finished=False)
    assert 0 < CompactionRecord.objects.count()
    retention_apply()
    assert_nothing_kept_was_lost(acme, estate, finished=True)
    assert_each_removal_recorded_once(estate)
    assert not PendingFileDeletion.objects.exists()


def two_jobs_at_once(acme, estate) -> None:  # noqa: ANN001
    """Two jobs started together, each pausing inside every batch's transaction so that
    their work overlaps. Between them they remove each removable checkpoint exactly once.

    On PostgreSQL each job also shows it met the other: it removed checkpoints, or skipped
    runs the other held locked; a job that started after the other had finished would do
    neither. SQLite serializes writers (the second job waits for the first's write lock
    and then finds the work done), so there only the outcome is checked."""
    jobs = [start_job("--batch-size", "2", pause=0.3, app_name=f"{APP}-{n}") for n in (1, 2)]
    summaries = []
    for job in jobs:
        out, err = job.communicate(timeout=240)
        assert job.returncode == 0, err
        summaries.append(next(line for line in out.splitlines() if line.startswith("Retention")))
    assert_nothing_kept_was_lost(acme, estate, finished=True)
    assert_each_removal_recorded_once(estate)
    removed = [int(line.split("removed ")[1].split(" ")[0]) for line in summaries]
    assert sum(removed) == removable_total(estate)
    if connection.vendor == "postgresql":
        skipped = [int(line.split("skipped ")[1].rstrip(".")) for line in summaries]
        assert all(r or s for r, s in zip(removed, skipped, strict=True)), summaries
