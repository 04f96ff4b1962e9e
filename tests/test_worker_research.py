"""The research workflow on real Celery worker subprocesses: it reaches its approval wait,
survives SIGKILL in the middle of every step, ignores duplicate and stale deliveries, and
two workers never run one run at once."""

from __future__ import annotations

import pytest
from django.utils import timezone

from checkpoints.models import Checkpoint, OutboxMessage, Run, RunStatus
from checkpoints.services.integrity import run_verify
from checkpoints.services.outbox import outbox_enqueue
from runtime.rescue import runs_rescue
from runtime.services.runs import run_create
from tenants.services import Actor
from tests.runtime_workflows import GATED_STEPS
from tests.worker_fixtures import wait_for

pytestmark = [pytest.mark.worker, pytest.mark.django_db(transaction=True)]

BUDGET = {"max_attempts": 20, "max_tokens": 100000, "max_cost": 10.0}


def start_run(tenant, workflow_type="research", **inputs):  # noqa: ANN001, ANN201
    return run_create(
        tenant=tenant,
        workflow_type=workflow_type,
        inputs={"question": "Why build cairns?", **inputs},
        budget=BUDGET,
        actor=Actor.system("test"),
    )


def settled_in(run, status: str) -> bool:  # noqa: ANN001
    """The run has that status and no worker holds it any more."""
    return Run.objects.filter(pk=run.pk, status=status, lease_owner="").exists()


def wait_for_status(run, status: str) -> Run:  # noqa: ANN001
    wait_for(lambda: settled_in(run, status), what=f"run {run.pk} to settle in {status}")
    return Run.objects.get(pk=run.pk)


def accepted_steps(run) -> list[str]:  # noqa: ANN001
    return list(
        Checkpoint.objects.filter(run=run)
        .exclude(step="")
        .order_by("sequence")
        .values_list("step", flat=True)
    )


def test_the_research_workflow_reaches_its_approval_wait_on_a_real_worker(acme, worker_factory):
    run = start_run(acme)
    worker_factory("w1")
    run = wait_for_status(run, RunStatus.WAITING_APPROVAL)
    assert run.state == "request_approval"
    assert accepted_steps(run) == GATED_STEPS
    assert list(Checkpoint.objects.filter(run=run).values_list("sequence", flat=True)) == [
        1,
        2,
        3,
        4,
        5,
    ]
    assert run_verify(tenant=acme, run_id=run.pk)["ok"]
    assert run.budget_used["attempts_used"] == 4
    assert run.budget_used["tokens_used"] > 0
    assert run.restore_count == 0


def test_duplicate_and_stale_deliveries_do_nothing(acme, worker_factory):
    run = start_run(acme)
    worker_factory("w1")
    run = wait_for_status(run, RunStatus.WAITING_APPROVAL)
    before = (run.version, Checkpoint.objects.filter(run=run).count(), run.budget_used)
    # Every command the run ever received, delivered again, plus a duplicate of the current
    # one; then a sentinel run behind them in the same queue (one solo worker, FIFO).
    payloads = list(OutboxMessage.objects.filter(run=run).values_list("payload", flat=True))
    payloads.append({"run_id": str(run.pk), "expected_version": run.version})
    for payload in payloads:
        outbox_enqueue(run=run, kind="run.resume", payload=payload)
    sentinel = start_run(acme)
    wait_for_status(sentinel, RunStatus.WAITING_APPROVAL)
    run.refresh_from_db()
    after = (run.version, Checkpoint.objects.filter(run=run).count(), run.budget_used)
    assert after == before
    assert run.status == RunStatus.WAITING_APPROVAL
    assert run.restore_count == 0


def test_a_worker_backs_off_while_another_holds_the_lease(acme, worker_factory, tmp_path):
    gate = tmp_path / "gate"
    gate.mkdir()
    (gate / "extract_claims.hold").touch()
    run = start_run(acme, "research_gated", gate_dir=str(gate))
    first = worker_factory("holder")
    wait_for(lambda: (gate / "extract_claims.entered").exists(), what="extract_claims to start")
    holder = Run.objects.get(pk=run.pk).lease_owner
    assert holder
    # The same command again, to a second worker: the lease is held, so it backs off.
    second = worker_factory("racer")
    outbox_enqueue(
        run=run,
        kind="run.resume",
        payload={"run_id": str(run.pk), "expected_version": Run.objects.get(pk=run.pk).version},
    )
    wait_for(lambda: "backing off" in second.log(), what="the second worker to back off")
    assert Run.objects.get(pk=run.pk).lease_owner == holder
    (gate / "extract_claims.hold").unlink()
    run = wait_for_status(run, RunStatus.WAITING_APPROVAL)
    assert accepted_steps(run) == GATED_STEPS
    assert (gate / "extract_claims.runs").read_text().count("\n") == 1
    assert run.restore_count == 0
    assert first.alive and second.alive


def test_a_worker_killed_in_the_middle_of_each_step_is_resumed_without_repeating_a_step(
    acme, worker_factory, tmp_path
):
    gate = tmp_path / "gate"
    gate.mkdir()
    for step in GATED_STEPS:
        (gate / f"{step}.hold").touch()
    run = start_run(acme, "research_gated", gate_dir=str(gate))
    worker = worker_factory("w0")
    remaining_before = None
    for index, step in enumerate(GATED_STEPS):
        wait_for(lambda s=step: (gate / f"{s}.entered").exists(), what=f"{step} to start")
        at_crash = Run.objects.get(pk=run.pk)
        worker.kill()
        # Spent before the crash: this attempt and the step's first model call.
        assert at_crash.budget_used["attempts_used"] == 2 * index + 1
        assert at_crash.budget_used["tokens_used"] > 0
        if remaining_before is not None:
            assert at_crash.budget_used["tokens_used"] >= remaining_before["tokens_used"]
        remaining_before = at_crash.budget_used
        (gate / f"{step}.hold").unlink()
        # The dead worker's lease expires; the rescue sweep queues the run again.
        wait_for(
            lambda: Run.objects.get(pk=run.pk).lease_expires_at < timezone.now(),
            what="the dead worker's lease to expire",
        )
        assert runs_rescue() == 1
        worker = worker_factory(f"w{index + 1}")
    run = wait_for_status(run, RunStatus.WAITING_APPROVAL)

    # Each step's accepted checkpoint exists exactly once, in order, with no gap.
    assert accepted_steps(run) == GATED_STEPS
    sequences = list(Checkpoint.objects.filter(run=run).values_list("sequence", flat=True))
    assert sequences == list(range(1, len(GATED_STEPS) + 2))
    assert run_verify(tenant=acme, run_id=run.pk)["ok"]
    # Each step ran twice (killed, then resumed); no accepted step ran again.
    for step in GATED_STEPS:
        assert (gate / f"{step}.runs").read_text().count("\n") == 2, step
    assert run.restore_count == len(GATED_STEPS)
    # Every killed attempt stayed spent: the budget left never grew back.
    assert run.budget_used["attempts_used"] == 2 * len(GATED_STEPS)
    assert run.budget_used["tokens_used"] >= remaining_before["tokens_used"]
