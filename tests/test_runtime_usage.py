"""What a step costs its run: its wall-clock time is recorded by its own checkpoint (or
charged on its own when no checkpoint follows), and a step in the worker's lean loop writes
the run once — its commit, which also renews the lease and charges the next step's attempt
(the first step of a task is charged on its own, before it runs)."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from checkpoints.models import Run, RunStatus
from runtime import Next, Workflow
from runtime.errors import LeaseLost
from runtime.lease import LeaseKeeper
from runtime.services.leases import lease_acquire
from tests.runtime_support import advance, envelope_at, start

pytestmark = pytest.mark.django_db

STEP_SECONDS = 0.2

slow = Workflow("slow", version="1")


@slow.step("wait", next="done")
def wait(ctx):  # noqa: ANN001, ANN201
    time.sleep(STEP_SECONDS)
    return {"waited": STEP_SECONDS}


slow.terminal("done")

astray = Workflow("astray", version="1")


@astray.step("wander", next=["left", "right"])
def wander(ctx):  # noqa: ANN001, ANN201
    time.sleep(STEP_SECONDS)
    return Next("lost", {})


astray.terminal("left", "right", "lost")


def _chain(name: str, steps: int) -> Workflow:
    workflow = Workflow(name, version="1")
    states = [f"s{i}" for i in range(1, steps + 1)]
    for index, state in enumerate(states):
        following = states[index + 1] if index + 1 < steps else "done"
        workflow.add_step(state, lambda ctx: {}, next=following)
    workflow.terminal("done")
    return workflow


three_steps = _chain("three_steps", 3)
six_steps = _chain("six_steps", 6)


def test_a_steps_time_is_recorded_by_its_own_checkpoint(acme):
    run = start(acme, "slow")
    assert advance(run) == "succeeded"
    run.refresh_from_db()
    recorded = envelope_at(run, 2)["budgets"]["elapsed_seconds"]
    assert recorded >= STEP_SECONDS
    # The run's usage is the checkpoint's: nothing was charged after it.
    assert run.budget_used["elapsed_seconds"] == recorded
    assert run.budget_used["attempts_used"] == 1


def test_a_step_whose_result_is_refused_still_pays_for_its_time(acme):
    run = start(acme, "astray")
    assert advance(run) == "paused"
    run.refresh_from_db()
    assert run.status == RunStatus.PAUSED_FOR_REVIEW
    assert run.checkpoint_sequence == 1  # no checkpoint recorded the step
    assert run.budget_used["elapsed_seconds"] >= STEP_SECONDS


def _run_writes(workflow_type: str, acme) -> int:  # noqa: ANN001
    run = start(acme, workflow_type)
    with CaptureQueriesContext(connection) as queries:
        assert advance(run) == "succeeded"
    # The ORM's UPDATE, or the commit's statement (a CTE on PostgreSQL), which writes it.
    return sum(
        1
        for q in queries.captured_queries
        if " ".join(q["sql"].split()).replace('"', "").lstrip().startswith("UPDATE checkpoints_run")
        or "UPDATE checkpoints_run SET version" in " ".join(q["sql"].split())
    )


def test_each_lean_step_writes_the_run_once_its_commit(acme):
    # Taking and releasing the lease and the first step cost the same for both runs; the
    # difference is three lean steps. A separate charge, renewal or time flush per step
    # would make it more than one each.
    extra = _run_writes("six_steps", acme) - _run_writes("three_steps", acme)
    assert extra == 1 * 3


def test_the_attempt_charge_renews_the_lease_and_refuses_once_the_run_ended(acme):
    run = start(acme, "slow")
    lease_acquire(
        tenant=acme, run_id=run.pk, owner="w", ttl_seconds=60, expected_version=run.version
    )
    almost_gone = timezone.now() + timedelta(seconds=1)
    Run.objects.filter(pk=run.pk).update(lease_expires_at=almost_gone)
    keeper = LeaseKeeper(run=run, owner="w", version=run.version, ttl_seconds=60)
    assert keeper.charge(attempts_used=1)["attempts_used"] == 1
    run.refresh_from_db()
    assert run.lease_expires_at > almost_gone + timedelta(seconds=50)

    Run.objects.filter(pk=run.pk).update(status=RunStatus.CANCELLED)
    with pytest.raises(LeaseLost):
        keeper.renew()
    with pytest.raises(LeaseLost):
        keeper.charge(attempts_used=1)
    run.refresh_from_db()
    assert run.budget_used["attempts_used"] == 1
