"""Concurrent reservations on PostgreSQL: exactly one insert of a key wins, and a cancel
in progress cannot be slipped past.

The first transaction is held uncommitted until the second one is blocked (seen in
pg_stat_activity): two reservations of one run meet at the run's row lock, two of different
runs at the key's unique index (the IntegrityError path), and a reservation racing a cancel
waits for the cancel's row lock and then sees the run cancelling.
"""

from __future__ import annotations

import threading

import pytest
from django.db import connection, connections, transaction

from cairn.errors import IdempotencyKeyReused, RunNotActive
from checkpoints.models import ExternalOperation, RunStatus
from runtime.services.cancel import run_cancel
from runtime.services.operations import operation_reserve
from runtime.services.runs import run_create
from tenants.models import AuditEvent
from tenants.services import Actor

pytestmark = pytest.mark.postgres


def _reserve(run, name: str, fingerprint: str, key: str = "race-key"):  # noqa: ANN001, ANN202
    return operation_reserve(
        tenant=run.tenant,
        run_id=run.id,
        idempotency_key=key,
        action="publish",
        target="blog/why",
        request_fingerprint=fingerprint,
        actor=Actor.system(name),
    )


def _blocked_on_a_lock() -> bool:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity "
            "WHERE datname = current_database() AND wait_event_type = 'Lock'"
        )
        return cursor.fetchone()[0] >= 1


def _race(run, second_fingerprint: str, *, first_call=None, second_run=None) -> dict:  # noqa: ANN001
    """Run ``first_call`` (a reservation of "race-key" by default) in a transaction held open
    until a reservation of "race-key" for ``second_run`` (default ``run``) waits for it."""
    outcome: dict = {}
    holding, release = threading.Event(), threading.Event()
    first_call = first_call or (lambda: _reserve(run, "worker-a", "f" * 64))

    def first() -> None:
        try:
            with transaction.atomic():
                outcome["first"] = first_call()
                holding.set()
                assert release.wait(30), "the second reservation never blocked"
        finally:
            connections.close_all()

    def second() -> None:
        try:
            outcome["second"] = _reserve(second_run or run, "worker-b", second_fingerprint)
        except (IdempotencyKeyReused, RunNotActive) as exc:
            outcome["second"] = exc
        finally:
            connections.close_all()

    a = threading.Thread(target=first)
    a.start()
    assert holding.wait(30)
    b = threading.Thread(target=second)
    b.start()
    for _ in range(3000):
        if _blocked_on_a_lock():
            break
        threading.Event().wait(0.01)
    else:
        raise AssertionError("the second reservation did not wait for the first transaction")
    release.set()
    a.join(30)
    b.join(30)
    return outcome


def test_two_workers_reserving_one_key_one_wins_and_the_other_gets_its_record(
    postgres_only,  # noqa: ANN001
    run,  # noqa: ANN001
):
    outcome = _race(run, "f" * 64)
    (winner, won), (loser, lost) = outcome["first"], outcome["second"]
    assert (won, lost) == (True, False)
    assert loser.pk == winner.pk
    assert ExternalOperation.objects.filter(idempotency_key="race-key").count() == 1
    assert AuditEvent.objects.filter(action="operation.reserved").count() == 1


def test_a_concurrent_reservation_for_another_request_is_refused(
    postgres_only,  # noqa: ANN001
    run,  # noqa: ANN001
):
    outcome = _race(run, "e" * 64)
    assert isinstance(outcome["second"], IdempotencyKeyReused)
    stored = ExternalOperation.objects.get(idempotency_key="race-key")
    assert stored.request_fingerprint == "f" * 64


def test_a_reservation_for_another_run_meets_the_first_at_the_unique_key(
    postgres_only,  # noqa: ANN001
    run,  # noqa: ANN001
    bob,  # noqa: ANN001
):
    other = run_create(
        tenant=run.tenant,
        workflow_type="research",
        inputs={"question": "another"},
        execution="external",
        actor=Actor(user=bob),
    )
    outcome = _race(run, "f" * 64, second_run=other)
    assert isinstance(outcome["second"], IdempotencyKeyReused)
    assert "already used for an operation of another run" in outcome["second"].detail
    assert ExternalOperation.objects.get(idempotency_key="race-key").run_id == run.id


def test_a_reservation_racing_a_cancel_waits_for_it_and_is_refused(
    postgres_only,  # noqa: ANN001
    run,  # noqa: ANN001
    bob,  # noqa: ANN001
):
    _reserve(run, "worker-a", "e" * 64, key="in-flight")  # open: the cancel must wait for it

    def cancel():  # noqa: ANN202
        return run_cancel(
            tenant=run.tenant, run_id=run.id, reason="stop", actor=Actor(user=bob), settle=False
        )

    outcome = _race(run, "f" * 64, first_call=cancel)
    assert outcome["first"].status == RunStatus.CANCELLING
    assert isinstance(outcome["second"], RunNotActive)
    assert "being cancelled" in outcome["second"].detail
    assert not ExternalOperation.objects.filter(idempotency_key="race-key").exists()
