"""Worker heartbeats: a beat is written on the database's clock and measures the worker's
clock against it; a worker silent past the bound is dead, and the rescue takes its runs over
at once (without waiting for their leases), but never on a view of the database that is not
steady yet. Real worker processes are killed in tests/test_liveness_workers.py."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from cairn import clock
from checkpoints.models import OutboxMessage, Run, WorkerHeartbeat
from checkpoints.services.checkpoints import CommitRequest, WorkerLoop, checkpoint_commit
from runtime import heartbeats, rescue
from runtime.heartbeats import heartbeat_beat, workers_dead, workers_liveness
from runtime.services.leases import lease_acquire
from tenants.services import Actor
from tests.runtime_support import start

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _settings(settings):  # noqa: ANN001
    settings.CAIRN_LEASE_SECONDS = 60
    settings.CAIRN_WORKER_DEAD_SECONDS = 3


def seen(worker_id: str, seconds_ago: float) -> None:
    WorkerHeartbeat.objects.update_or_create(
        worker_id=worker_id,
        defaults={"last_seen_at": clock.db_now() - timedelta(seconds=seconds_ago)},
    )


def test_a_beat_is_the_databases_time_and_measures_the_workers_clock(monkeypatch):
    monkeypatch.setattr(clock, "_offset_seconds", 0.0)  # this process's, restored after
    real = timezone.now
    monkeypatch.setattr(timezone, "now", lambda: real() + timedelta(seconds=120))
    offset = heartbeat_beat("host:1:abc")
    row = WorkerHeartbeat.objects.get(worker_id="host:1:abc")
    assert 119 < offset < 121 and row.clock_offset_seconds == offset
    assert abs((row.last_seen_at - clock.db_now()).total_seconds()) < 2  # not the worker's
    assert 119 < (timezone.now() - clock.now()).total_seconds() < 121  # corrected estimate


def test_a_worker_is_live_until_its_beat_is_older_than_the_bound():
    seen("fresh", 0.5)
    seen("silent", 5)
    seen("long-gone", 3600)
    state = {w.worker_id: w.live for w in workers_liveness()}
    assert state == {"fresh": True, "silent": False, "long-gone": False}
    # Only a worker that died within a lease period can still hold a lease.
    assert workers_dead() == ["silent"]


@pytest.fixture
def held(acme):  # noqa: ANN001, ANN201
    """A run whose worker goes on in its own loop: leased, its next command claimed."""
    run = start(acme, "research")
    OutboxMessage.objects.filter(run=run).update(sent_at=timezone.now())
    lease_acquire(
        tenant=acme, run_id=run.pk, owner="doomed", ttl_seconds=60, expected_version=run.version
    )
    run.refresh_from_db()
    result = checkpoint_commit(
        tenant=acme,
        run_id=run.pk,
        request=CommitRequest(
            expected_version=run.version,
            state="extract_claims",
            step="collect_sources",
            envelope={},
            actor=Actor.system("worker doomed"),
            lease_owner="doomed",
            worker=WorkerLoop(),
        ),
    )
    run.refresh_from_db()
    return run, result.outbox_id


def steady(monkeypatch, seconds: float) -> None:  # noqa: ANN001
    monkeypatch.setattr(rescue, "heartbeat_steady_for", lambda: seconds)


def test_a_dead_workers_run_is_queued_again_before_its_lease_expires(held, monkeypatch):
    run, claimed = held
    seen("doomed", 10)
    steady(monkeypatch, 10)
    assert rescue.runs_rescue() == 0  # by its lease, the run is still the worker's
    assert rescue.runs_rescue_dead_workers() == 1
    run.refresh_from_db()
    assert run.lease_owner == "doomed" and run.lease_expires_at <= clock.db_now()
    # The command it was carrying out itself is superseded by one at the run's version.
    assert OutboxMessage.objects.get(pk=claimed).sent_at is not None
    queued = OutboxMessage.objects.filter(run=run, sent_at__isnull=True)
    assert [m.payload["expected_version"] for m in queued] == [run.version]
    assert rescue.runs_rescue_dead_workers() == 0
    assert rescue.runs_rescue() == 0  # one command, not two


def test_a_live_workers_run_is_left_alone(held, monkeypatch):
    run, _ = held
    seen("doomed", 0.5)
    steady(monkeypatch, 10)
    assert rescue.runs_rescue_dead_workers() == 0
    run.refresh_from_db()
    assert run.lease_expires_at > clock.db_now()


def test_nobody_is_called_dead_while_the_rescuers_own_beat_is_not_steady(held, monkeypatch):
    """Right after the database was away every beat is old, the live workers' too."""
    seen("doomed", 10)
    steady(monkeypatch, 1)
    assert rescue.runs_rescue_dead_workers() == 0
    assert heartbeats.heartbeat_steady_for() == 0  # this test process does not beat


def test_a_worker_with_no_heartbeat_keeps_its_lease_until_it_expires(held, monkeypatch):
    """An owner that never beat (an external runner's lease) is never called dead."""
    run, _ = held
    steady(monkeypatch, 10)
    assert rescue.runs_rescue_dead_workers() == 0
    assert Run.objects.get(pk=run.pk).lease_expires_at > clock.db_now()
