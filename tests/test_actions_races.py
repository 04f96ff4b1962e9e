"""Operators racing on one run version (real PostgreSQL, real threads): exactly one action
wins, the others are refused as stale, and nothing half-written remains."""

from __future__ import annotations

import threading

import pytest
from django.db import connection

from cairn.errors import (
    ActionNotAllowed,
    ConcurrentCheckpointWrite,
    LeaseHeld,
    RunNotActive,
)
from checkpoints.models import Checkpoint, OutboxMessage
from runtime.services.actions import run_grant_budget
from runtime.services.cancel import run_cancel
from runtime.services.retry import run_retry
from tenants.models import AuditEvent
from tenants.services import Actor
from tests.actions_support import advance, worker_run

pytestmark = pytest.mark.postgres


def test_racing_actions_on_one_version_let_exactly_one_through(postgres_only, acme, bob):
    run = worker_run(acme, bob, budget={"max_attempts": 5})
    run = advance(advance(run, bob, "draft_answer"), bob, "review")
    version, checkpoints_before = run.version, Checkpoint.objects.filter(run=run).count()
    outbox_before = OutboxMessage.objects.filter(run=run).count()
    actor = Actor(user=bob)
    calls = [
        lambda: run_cancel(
            tenant=acme, run_id=run.id, reason="c", expected_version=version, actor=actor
        ),
        lambda: run_retry(
            tenant=acme,
            run_id=run.id,
            step="draft",
            reason="r",
            expected_version=version,
            actor=actor,
        ),
        lambda: run_grant_budget(
            tenant=acme,
            run_id=run.id,
            attempts=1,
            reason="g",
            expected_version=version,
            actor=actor,
        ),
    ] * 3
    barrier = threading.Barrier(len(calls))
    outcomes: list[str] = []
    lock = threading.Lock()

    def act(call) -> None:  # noqa: ANN001
        try:
            barrier.wait()
            call()
            result = "ok"
        except (ConcurrentCheckpointWrite, RunNotActive, LeaseHeld, ActionNotAllowed) as exc:
            result = type(exc).__name__
        finally:
            connection.close()
        with lock:
            outcomes.append(result)

    threads = [threading.Thread(target=act, args=(call,)) for call in calls]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert len(outcomes) == len(calls), outcomes  # no thread died on an unexpected error
    assert outcomes.count("ok") == 1, outcomes
    # A grant is refused while the run waits for an approval bound to its version (it
    # would invalidate the approval), so it never wins here; it is only refused sooner.
    allowed = {"ConcurrentCheckpointWrite", "RunNotActive", "ActionNotAllowed"}
    assert set(outcomes) - {"ok"} <= allowed, outcomes
    run.refresh_from_db()
    assert run.version == version + 1
    actions = AuditEvent.objects.filter(
        run_id=run.id, action__in=["run.cancel", "run.retry", "run.budget_grant"]
    )
    assert actions.count() == 1
    winner = actions.get().action
    new_checkpoints = Checkpoint.objects.filter(run=run).count() - checkpoints_before
    assert new_checkpoints == (1 if winner == "run.retry" else 0)
    new_messages = OutboxMessage.objects.filter(run=run).count() - outbox_before
    assert new_messages == (1 if winner == "run.retry" else 0)
