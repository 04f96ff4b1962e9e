"""No approved run is stranded, and a dead worker's run is taken over within seconds: real
Celery workers, a real broker whose queue is flushed, real SIGKILLs and a real beat.

- The decision's command is published and the broker loses it: the rescue queues it again
  and a worker publishes the approved draft once.
- The worker that took the decision's command dies at the gate, after the approval was
  consumed and before its commit: the next worker goes on under that same approval.
- A worker is SIGKILLed in the middle of a step while its lease has a minute to run (the
  shipped default): with the shipped beat, another worker runs that step again long before
  the dead worker's lease would have expired.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

import tests.runtime_workflows  # noqa: F401 - declares research_gated in this process too
from approvals.models import ApprovalRequest, ApprovalStatus
from checkpoints.models import Checkpoint, OutboxMessage, Run, RunStatus
from runtime.rescue import runs_rescue
from runtime.services.runs import run_create
from tenants.services import Actor
from tests.approvals_support import start_demo
from tests.faults import CRASH_AT, CRASH_MARKER
from tests.scaleout_support import process
from tests.worker_fixtures import database_env, wait_for

pytestmark = [pytest.mark.worker, pytest.mark.django_db(transaction=True)]


def pending_request(run: Run) -> ApprovalRequest:
    return wait_for(
        lambda: ApprovalRequest.objects.filter(run=run, status=ApprovalStatus.PENDING).first(),
        what="the run to ask for approval",
        timeout=180,
    )


def approve_over_the_api(api_as, carol, acme, request: ApprovalRequest) -> None:  # noqa: ANN001
    response = api_as(carol, acme).post(
        f"/api/v1/approvals/{request.pk}/decision",
        {"decision": "approve", "artifact_sha256": request.artifact_sha256},
        format="json",
    )
    assert response.status_code == 200, response.json()


def flush_the_broker() -> None:
    """The broker restarts without its queue: every message in it is gone."""
    from cairn.celery import app

    with app.connection_for_write() as conn:
        conn.default_channel.queue_purge(app.conf.task_default_queue)


def rescued(run: Run) -> int:
    """The shipped rescue, once the dead worker's lease and the grace have passed."""
    return wait_for(runs_rescue, what=f"the rescue to queue run {run.pk} again", timeout=60)


def succeeded_once(run: Run, publishing_service) -> Run:  # noqa: ANN001
    wait_for(
        lambda: Run.objects.filter(pk=run.pk, status=RunStatus.SUCCEEDED).exists(),
        what="the run to succeed",
        timeout=180,
    )
    assert publishing_service.stats()["publications"] == 1
    return Run.objects.get(pk=run.pk)


def test_an_approved_run_whose_command_the_broker_lost_is_queued_again(
    acme, bob, carol, api_as, worker_factory, publishing_service
):
    run = start_demo(acme, bob)
    first = worker_factory("w1")
    request = pending_request(run)
    first.kill()  # nobody takes the decision's command before the broker loses it
    # The decision's own command: a worker killed before its task's end may leave its own
    # (claimed) command unsent, which only the rescue supersedes.
    before = OutboxMessage.objects.filter(run=run).order_by("-id").values_list("id", flat=True)[0]
    approve_over_the_api(api_as, carol, acme, request)
    decided = OutboxMessage.objects.filter(run=run, kind="run.resume", id__gt=before)
    assert decided.exists()
    wait_for(
        lambda: not decided.filter(sent_at__isnull=True).exists(),
        what="the decision's command to reach the broker",
    )
    flush_the_broker()
    assert rescued(run) == 1
    worker_factory("w2")
    succeeded_once(run, publishing_service)


def test_a_worker_killed_at_the_gate_leaves_the_approval_unused_and_the_run_to_the_next(
    acme, bob, carol, api_as, worker_factory, publishing_service, tmp_path
):
    marker = tmp_path / "crashed"
    run = start_demo(acme, bob)
    doomed = worker_factory("doomed", env={CRASH_AT: "approval.granted", CRASH_MARKER: str(marker)})
    request = pending_request(run)
    approve_over_the_api(api_as, carol, acme, request)
    wait_for(lambda: marker.exists() and not doomed.alive, what="the worker to die at the gate")
    request.refresh_from_db()
    run.refresh_from_db()
    # Consumption is the commit's, in its transaction: the gate alone used nothing.
    assert (request.status, run.status) == (ApprovalStatus.APPROVED, RunStatus.WAITING_APPROVAL)
    assert rescued(run) == 1
    worker_factory("w2")
    run = succeeded_once(run, publishing_service)
    assert run.restore_count == 1
    publish = Checkpoint.objects.get(run=run, step="request_approval")
    assert publish.state == "publish"  # moved on under the one approval, used once
    request.refresh_from_db()
    assert request.status == ApprovalStatus.CONSUMED


def test_a_killed_workers_run_is_taken_over_long_before_its_lease_expires(
    acme, broker, worker_factory, tmp_path
):
    """Lease, heartbeats and beat as shipped: a minute-long lease, the dead-worker rescue."""
    shipped = {"CAIRN_LEASE_SECONDS": "60"}
    gate = tmp_path / "gate"
    gate.mkdir()
    (gate / "extract_claims.hold").write_text("hold")
    doomed = worker_factory("doomed", env=shipped)
    run = run_create(
        tenant=acme,
        workflow_type="research_gated",
        inputs={"question": "q", "gate_dir": str(gate)},
        budget={"max_attempts": 20},
        actor=Actor.system("test"),
    )
    wait_for((gate / "extract_claims.entered").exists, what="the worker to enter the step")
    (gate / "extract_claims.entered").unlink()
    survivor = worker_factory("survivor", env=shipped)
    beat = [sys.executable, "-m", "celery", "-A", "cairn", "beat", "--loglevel", "INFO"]
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        **broker.env,
        **database_env(),
        **shipped,
    }
    with process([*beat, "-s", str(tmp_path / "beat")], env=env, log=tmp_path / "beat.log"):
        # The survivor takes the beat's tasks (its first one starts its heartbeat).
        wait_for(
            lambda: "checkpoints.outbox_sweep" in survivor.log(),
            what="the survivor to take a task from the beat",
        )
        run.refresh_from_db()
        lease_would_expire = run.lease_expires_at
        doomed.kill()
        (gate / "extract_claims.hold").unlink()
        taken_over = wait_for(
            lambda: Checkpoint.objects.filter(run=run, state="draft_answer").first(),
            what="another worker to run the step again and commit it",
            timeout=90,
        )
    assert taken_over.created_at < lease_would_expire
    run.refresh_from_db()
    assert run.restore_count == 1
    runs = Path(gate / "extract_claims.runs").read_text().split()
    assert len(runs) == 2 and runs[0] != runs[1]  # once per worker: the killed step, again
