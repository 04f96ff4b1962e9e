"""A worker whose database goes away mid-task (a restart, a failover) hands its run back as
soon as the database answers: its lease ends and the run is queued again, instead of the run
sitting out the minute-long lease of a worker that is alive but has nothing left to do. The
chaos rehearsal (tests/chaos_rehearsal.py) restarts a real PostgreSQL under the workers;
here the commit's connection breaks once, as it does when the server goes down."""

from __future__ import annotations

import pytest
from django.db import OperationalError

from cairn import clock
from checkpoints.models import OutboxMessage, Run
from runtime import executor
from runtime.executor import run_advance
from tests.liveness_support import deliver
from tests.runtime_support import start

pytestmark = pytest.mark.django_db


def test_a_worker_that_loses_the_database_in_a_commit_hands_the_run_back(
    acme, settings, monkeypatch
):  # noqa: ANN001
    settings.CAIRN_LEASE_SECONDS = 60
    run = start(acme, "research")
    OutboxMessage.objects.filter(run=run).update(sent_at=clock.db_now())
    real = executor.checkpoint_commit

    def the_server_goes_away(**kwargs):  # noqa: ANN003, ANN202
        monkeypatch.setattr(executor, "checkpoint_commit", real)
        raise OperationalError("server closed the connection unexpectedly")

    monkeypatch.setattr(executor, "checkpoint_commit", the_server_goes_away)
    assert run_advance(run_id=run.pk, expected_version=1, owner="lost") == "handed_back"
    run.refresh_from_db()
    assert run.lease_owner == "" or run.lease_expires_at <= clock.db_now()
    queued = OutboxMessage.objects.filter(run=run, sent_at__isnull=True)
    assert [m.payload["expected_version"] for m in queued] == [run.version]
    assert deliver(run) == ["waiting_approval"]  # the next worker goes on from there
    assert Run.objects.get(pk=run.pk).checkpoint_sequence > 1
