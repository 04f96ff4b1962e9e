"""Concurrent reservation of one idempotency key on PostgreSQL: exactly one insert wins.

The first reservation is held uncommitted until the second one is blocked on the unique
index (seen in pg_stat_activity), so the race takes the IntegrityError path every time.
"""

from __future__ import annotations

import threading

import pytest
from django.db import connection, connections, transaction

from checkpoints.errors import IdempotencyKeyReused
from checkpoints.models import ExternalOperation
from checkpoints.services.operations import operation_reserve
from tenants.models import AuditEvent
from tenants.services import Actor

pytestmark = pytest.mark.postgres


def _reserve(run, name: str, fingerprint: str):  # noqa: ANN001, ANN202
    return operation_reserve(
        tenant=run.tenant,
        run_id=run.id,
        idempotency_key="race-key",
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


def _race(run, second_fingerprint: str) -> dict:  # noqa: ANN001
    outcome: dict = {}
    holding, release = threading.Event(), threading.Event()

    def first() -> None:
        try:
            with transaction.atomic():
                outcome["first"] = _reserve(run, "worker-a", "f" * 64)
                holding.set()
                assert release.wait(30), "the second reservation never blocked"
        finally:
            connections.close_all()

    def second() -> None:
        try:
            outcome["second"] = _reserve(run, "worker-b", second_fingerprint)
        except IdempotencyKeyReused as exc:
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
        raise AssertionError("the second reservation did not wait on the first one's row")
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
