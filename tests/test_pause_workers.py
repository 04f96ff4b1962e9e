"""Pause and unpause around real Celery workers (issue 29, item 4): a paused run is never
dispatched, and a step in flight when the pause comes finishes, commits, and is the last
one until the run is unpaused."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from django.utils import timezone

import tests.runtime_workflows  # noqa: F401 - declares research_gated in this process too
from checkpoints.models import Checkpoint, Run, RunStatus
from checkpoints.services import outbox
from runtime.rescue import runs_rescue
from runtime.services.pause import run_pause, run_unpause
from runtime.services.runs import run_create
from tenants.services import Actor
from tests.runtime_workflows import GATED_STEPS
from tests.worker_fixtures import wait_for

pytestmark = [pytest.mark.worker, pytest.mark.django_db(transaction=True)]

QUIET_SECONDS = 3.0  # how long the tests watch a paused run for a step that must not come


def gated_run(tenant, gate) -> Run:  # noqa: ANN001
    return run_create(
        tenant=tenant,
        workflow_type="research_gated",
        inputs={"question": "Why build cairns?", "gate_dir": str(gate)},
        budget={"max_attempts": 20, "max_tokens": 100000, "max_cost": 10.0},
        actor=Actor.system("test"),
    )


def steps_run(gate) -> dict[str, int]:  # noqa: ANN001
    """How many times each gated step function started, from the gate's own records."""
    return {
        path.name.removesuffix(".runs"): path.read_text().count("\n")
        for path in gate.glob("*.runs")
    }


def nothing_moves(run: Run, gate, seconds: float = QUIET_SECONDS) -> None:  # noqa: ANN001
    """Over ``seconds``, with the relay and the rescue sweeping as the beat would, no step
    starts and no checkpoint is written."""
    before = (Run.objects.get(pk=run.pk).checkpoint_sequence, steps_run(gate))
    Run.objects.filter(pk=run.pk).update(updated_at=timezone.now() - timedelta(hours=1))
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        assert outbox.outbox_dispatch() == 0
        assert runs_rescue() == 0
        time.sleep(0.2)
    assert (Run.objects.get(pk=run.pk).checkpoint_sequence, steps_run(gate)) == before


def test_a_paused_run_is_never_dispatched_until_unpaused(acme, bob, worker_factory, tmp_path):
    gate = tmp_path / "gate"
    gate.mkdir()
    run = gated_run(acme, gate)  # its first command is published on commit
    run_pause(tenant=acme, run_id=run.pk, reason="check the sources", actor=Actor(user=bob))
    worker = worker_factory("w1")
    wait_for(
        lambda: "command for a paused run ignored" in worker.log(),
        what="the worker to receive the command and start no step",
    )
    worker_factory("w2")  # a second idle worker: still nothing to take
    nothing_moves(run, gate)
    assert steps_run(gate) == {} and Run.objects.get(pk=run.pk).checkpoint_sequence == 1

    run_unpause(tenant=acme, run_id=run.pk, reason="sources fine", actor=Actor(user=bob))
    wait_for(
        lambda: Run.objects.filter(
            pk=run.pk, status=RunStatus.WAITING_APPROVAL, lease_owner=""
        ).exists(),
        what="the unpaused run to reach its approval",
    )
    assert steps_run(gate) == {step: 1 for step in GATED_STEPS}


def test_a_step_in_flight_commits_and_then_the_paused_run_stops(
    acme, bob, worker_factory, tmp_path
):
    gate = tmp_path / "gate"
    gate.mkdir()
    (gate / "extract_claims.hold").write_text("hold")
    worker_factory("w1")
    run = gated_run(acme, gate)
    wait_for((gate / "extract_claims.entered").exists, what="the worker to enter the step")
    paused = run_pause(tenant=acme, run_id=run.pk, reason="look first", actor=Actor(user=bob))
    assert paused.lease_owner  # a worker holds the run, mid-step
    (gate / "extract_claims.hold").unlink()  # the step finishes…
    committed = wait_for(
        lambda: Checkpoint.objects.filter(run=run, step="extract_claims").first(),
        what="the step in flight to commit",
    )
    assert committed.state == "draft_answer"
    wait_for(
        lambda: Run.objects.filter(pk=run.pk, lease_owner="").exists(),
        what="the worker to stop and release the run",
    )
    # …and is the last one: the next step never starts while the run is paused.
    nothing_moves(run, gate)
    run.refresh_from_db()
    assert (run.status, run.state, run.paused) == (RunStatus.RUNNING, "draft_answer", True)
    assert "draft_answer" not in steps_run(gate)

    run_unpause(tenant=acme, run_id=run.pk, actor=Actor(user=bob))
    wait_for(
        lambda: Run.objects.filter(
            pk=run.pk, status=RunStatus.WAITING_APPROVAL, lease_owner=""
        ).exists(),
        what="the unpaused run to go on to its approval",
    )
    assert steps_run(gate) == {step: 1 for step in GATED_STEPS}  # nothing ran twice
