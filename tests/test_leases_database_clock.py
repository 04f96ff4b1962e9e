"""Leases are set and compared on the database's clock, never a worker's.

Each test runs a writer whose clock is off by two minutes (this process's ``timezone.now``
moved, as on a machine whose clock drifted; the database's clock is untouched), and checks
that it neither takes a healthy lease nor loses its own: the lease services, the keeper's
renewal, the commit's lease clause, the rescue and the outbox claim. ``tests/
test_clock_skew_workers.py`` does the same with real worker processes under ``faketime``.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from cairn import clock
from cairn.errors import LeaseHeld
from checkpoints.models import OutboxMessage, Run
from checkpoints.services.checkpoints import CommitRequest, WorkerLoop, checkpoint_commit
from checkpoints.services.outbox import outbox_dispatch
from runtime.lease import LeaseKeeper
from runtime.rescue import runs_rescue
from runtime.services.leases import lease_acquire
from tenants.services import Actor
from tests.runtime_support import start

pytestmark = pytest.mark.django_db

SKEW = timedelta(seconds=120)


@pytest.fixture
def clock_off(monkeypatch):  # noqa: ANN001, ANN201
    """``clock_off(+1)`` moves this process's clock two minutes ahead, ``clock_off(-1)``
    behind, ``clock_off(0)`` puts it right."""
    real = timezone.now

    def set_skew(sign: int) -> None:
        monkeypatch.setattr(timezone, "now", lambda: real() + sign * SKEW)

    return set_skew


@pytest.fixture
def run(acme, settings):  # noqa: ANN001, ANN201
    settings.CAIRN_LEASE_SECONDS = 60
    return start(acme, "research")


def lease(run: Run, owner: str):  # noqa: ANN201
    return lease_acquire(
        tenant=run.tenant,
        run_id=run.pk,
        owner=owner,
        ttl_seconds=60,
        expected_version=run.version,
    )


def seconds_left(run: Run) -> float:
    run.refresh_from_db()
    return (run.lease_expires_at - clock.db_now()).total_seconds()


def test_a_worker_whose_clock_runs_fast_does_not_take_a_healthy_lease(run, clock_off):
    lease(run, "healthy")
    clock_off(+1)
    with pytest.raises(LeaseHeld):
        lease(run, "fast")
    run.refresh_from_db()
    assert (run.lease_owner, run.restore_count) == ("healthy", 0)


def test_a_worker_whose_clock_runs_slow_sets_a_lease_that_lasts_its_whole_term(run, clock_off):
    clock_off(-1)
    lease(run, "slow")
    assert 55 < seconds_left(run) <= 60
    clock_off(0)
    with pytest.raises(LeaseHeld):
        lease(run, "other")


def test_the_keeper_renews_for_the_whole_term_whatever_the_workers_clock(run, clock_off):
    granted = lease(run, "slow")
    keeper = LeaseKeeper(run=run, owner="slow", version=granted.run_version, ttl_seconds=60)
    clock_off(-1)
    keeper.renew()
    assert 55 < seconds_left(run) <= 60
    keeper.charge(attempts_used=1)
    assert 55 < seconds_left(run) <= 60


def _commit(run: Run, owner: str, state: str = "extract_claims"):  # noqa: ANN202
    run.refresh_from_db()
    return checkpoint_commit(
        tenant=run.tenant,
        run_id=run.pk,
        request=CommitRequest(
            expected_version=run.version,
            state=state,
            step="collect_sources",
            envelope={},
            actor=Actor.system(f"worker {owner}"),
            lease_owner=owner,
            worker=WorkerLoop(),
        ),
    )


def test_a_writer_whose_clock_runs_fast_cannot_commit_under_a_healthy_lease(run, clock_off):
    lease(run, "healthy")
    clock_off(+1)
    with pytest.raises(LeaseHeld):
        _commit(run, "fast")
    run.refresh_from_db()
    assert (run.checkpoint_sequence, run.lease_owner) == (1, "healthy")


def test_a_commit_renews_the_lease_and_claims_its_command_on_the_databases_clock(run, clock_off):  # noqa: ANN001
    lease(run, "slow")
    clock_off(-1)
    result = _commit(run, "slow")
    assert 55 < seconds_left(run) <= 60
    claim = OutboxMessage.objects.get(pk=result.outbox_id).claimed_until
    assert 55 < (claim - clock.db_now()).total_seconds() <= 60


def test_a_rescue_on_a_fast_clock_leaves_a_healthy_lease_alone(run, clock_off):
    lease(run, "healthy")
    OutboxMessage.objects.filter(run=run).update(sent_at=timezone.now() - timedelta(minutes=5))
    clock_off(+1)
    assert runs_rescue() == 0


def test_a_dispatcher_on_a_fast_clock_leaves_a_workers_own_command_alone(run, clock_off):
    lease(run, "healthy")
    OutboxMessage.objects.filter(run=run).update(sent_at=timezone.now())
    result = _commit(run, "healthy")  # the worker goes on: its next command is its own
    clock_off(+1)
    assert outbox_dispatch() == 0
    assert OutboxMessage.objects.get(pk=result.outbox_id).sent_at is None


def test_a_renewed_claim_lapses_with_the_lease_not_after_it(run):  # noqa: ANN001
    # The command a worker carries out is claimed for exactly its lease: a claim that outlived
    # the lease by a moment made the rescue skip a dead worker's run whose lease had expired
    # (its command still looked claimed), so a rescue right at expiry found nothing.
    granted = lease(run, "w")
    command = OutboxMessage.objects.filter(run=run, kind="run.resume").latest("pk")
    keeper = LeaseKeeper(run=run, owner="w", version=granted.run_version, ttl_seconds=60)
    keeper.taken_outbox_id = command.pk
    for renew in (keeper.renew, lambda: keeper.charge(attempts_used=1)):
        renew()
        run.refresh_from_db()
        command.refresh_from_db()
        assert command.claimed_until == run.lease_expires_at
