"""Every path that moves a run is held to the approval invariant (issue 24).

One table names the paths: Cairn's worker, a runner's commit over HTTP, a commit from code
(the LangGraph store's way in), the operator actions (resume, retry, fork, grant, cancel
then resume), the decisions (approve, reject), the rescue sweep, a runner's effect over
HTTP and the expiry sweep. Each is
tried on a worker run of ``gated_publish`` waiting at its approval state ``review`` (or, for
the actions that take a run on, on a run whose history crossed ``review`` unapproved, as
older Cairn let it). After each: no checkpoint entered the states past ``review`` without
a consumed approval (an oracle independent of the code), ``verify`` says so too, and nothing
reached the provider that no consumed approval binds.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from approvals.models import ApprovalRequest, ApprovalStatus
from approvals.services.expiry import approval_expire_due
from cairn.errors import ApprovalRequired, CairnError
from checkpoints.models import Checkpoint, ExternalOperation, OutboxMessage, Run, RunStatus
from checkpoints.services.checkpoints import CommitRequest, checkpoint_commit
from checkpoints.services.integrity import run_verify
from checkpoints.services.reads import checkpoint_envelope
from runtime.executor import run_advance
from runtime.registry import workflows_sync
from runtime.rescue import runs_rescue
from runtime.services.runs import run_create
from tenants.services import Actor
from tests.approvals_support import decide
from tests.invariant_support import invariant_breaks, shipped_unapproved
from tests.runtime_support import checkpoint_write_raw

pytestmark = pytest.mark.django_db


@dataclass
class World:
    run: Run
    api: APIClient  # bob, an operator
    reviewer: object  # carol
    service: object

    def work(self) -> Run:
        self.run.refresh_from_db()
        run_advance(run_id=self.run.pk, expected_version=self.run.version, owner="test-worker")
        self.run.refresh_from_db()
        return self.run

    def post(self, path: str, body: dict) -> int:
        return self.answer(path, body).status_code

    def answer(self, path: str, body: dict):  # noqa: ANN201
        self.run.refresh_from_db()
        return self.api.post(f"/api/v1/runs/{self.run.pk}/{path}", body, format="json")

    def pending(self) -> ApprovalRequest:
        return ApprovalRequest.objects.get(run=self.run, status=ApprovalStatus.PENDING)

    def cross_unapproved(self, status: str = RunStatus.FAILED) -> None:
        """Rows older Cairn wrote for a failed commit from review into publish."""
        head = checkpoint_envelope(Checkpoint.objects.get(pk=self.run.latest_checkpoint_id))
        checkpoint_write_raw(
            self.run, head, state="publish", step="publish", schema_version=head["schema_version"]
        )
        Run.objects.filter(pk=self.run.pk).update(status=status, status_reason="crossed")
        self.run.refresh_from_db()


@pytest.fixture
def world(acme, alice, bob, carol, api_as, settings, publishing_service) -> World:  # noqa: ANN001
    import tests.invariant_workflows  # noqa: F401  (declares gated_publish)

    settings.CAIRN_PUBLISHING_URL = publishing_service.url
    settings.CAIRN_PUBLISHING_TOKEN_REF = ""
    settings.CAIRN_RETRY_DELAY_SECONDS = 0
    workflows_sync()
    run = run_create(
        tenant=acme,
        workflow_type="gated_publish",
        inputs={"title": "Cairns"},
        budget={"max_attempts": 30},
        actor=Actor(user=alice),
    )
    world = World(run, api_as(bob, acme), carol, publishing_service)
    world.work()
    assert (world.run.state, world.run.status) == ("review", RunStatus.WAITING_APPROVAL)
    return world


# --- the paths ---------------------------------------------------------------------------
def worker(w: World) -> None:
    w.work()  # no decision yet: the gate keeps it waiting
    assert w.run.state == "review"


def http_runner_commit(w: World) -> None:
    lease = {"owner": "script", "ttl_seconds": 30, "expected_version": w.run.version}
    assert w.post("lease", lease) == 200
    body = {"expected_version": w.run.version, "state": "publish", "step": "", "envelope": {}}
    for status in ("failed", "running", "waiting_retry", "paused_for_review", ""):
        with_status = {**body, "status": status} if status else body
        answer = w.answer("checkpoints", {**with_status, "lease_owner": "script"})
        assert (answer.status_code, answer.json()["code"]) == (409, "approval_required")
    unleased = w.answer("checkpoints", {**body, "status": "failed"})
    assert (unleased.status_code, unleased.json()["code"]) == (409, "lease_held")


def code_commit(w: World) -> None:
    """Cairn's own writers (the LangGraph store commits this way) and the recorded
    operator override: no flag lifts the rule."""
    for override in (False, True):
        with pytest.raises(ApprovalRequired):
            checkpoint_commit(
                tenant=w.run.tenant,
                run_id=w.run.pk,
                request=CommitRequest(
                    expected_version=w.run.version,
                    state="publish",
                    envelope={},
                    status=RunStatus.FAILED,
                    actor=Actor.system("langgraph"),
                    operator_override=override,
                ),
            )


def resume(w: World) -> None:
    w.cross_unapproved()
    assert w.post("actions/resume", {"expected_version": w.run.version}) == 409
    w.work()


def retry(w: World) -> None:
    assert w.post("actions/retry", {"step": "publish", "reason": "skip review"}) == 409
    w.cross_unapproved()
    assert w.post("actions/retry", {"step": "publish", "reason": "again"}) == 409
    w.work()


def fork(w: World) -> None:
    w.cross_unapproved()
    assert (
        w.post("actions/fork", {"from_sequence": w.run.checkpoint_sequence, "reason": "x"}) == 409
    )
    # From the approval state the fork is a new run that asks for its own approval.
    assert (
        w.post("actions/fork", {"from_sequence": w.run.checkpoint_sequence - 1, "reason": "x"})
        == 201
    )


def grant(w: World) -> None:
    assert w.post("actions/grant_budget", {"attempts": 5, "reason": "more"}) == 409  # waiting
    w.cross_unapproved()
    assert w.post("actions/grant_budget", {"attempts": 5, "reason": "more"}) == 200
    assert w.post("actions/resume", {"expected_version": w.run.version}) == 409


def cancel_then_resume(w: World) -> None:
    assert w.post("actions/cancel", {"reason": "stop"}) == 200
    assert w.post("actions/resume", {"expected_version": w.run.version}) == 409
    w.work()


def approve(w: World) -> None:
    decide(w.pending(), w.reviewer)
    w.work()  # the commit leaving review consumes it; publish ships the approved draft
    assert w.run.status == RunStatus.SUCCEEDED
    assert w.service.stats()["publications"] == 1


def reject(w: World) -> None:
    decide(w.pending(), w.reviewer, decision="reject", comment="not this")
    w.work()
    assert (w.run.state, w.run.status) == ("rejected", RunStatus.FAILED)
    assert w.post("actions/retry", {"step": "publish", "reason": "ship it anyway"}) == 409


def rescue(w: World) -> None:
    """A run older Cairn left running past review, its worker gone: the sweep queues it,
    and the worker that takes it performs nothing (the effect is refused)."""
    w.cross_unapproved(status=RunStatus.RUNNING)
    Run.objects.filter(pk=w.run.pk).update(
        lease_owner="dead-worker", lease_expires_at=timezone.now() - timedelta(seconds=5)
    )
    OutboxMessage.objects.filter(run=w.run).update(sent_at=timezone.now() - timedelta(hours=1))
    assert runs_rescue() >= 1
    w.work()
    assert w.run.status == RunStatus.FAILED and "approv" in w.run.status_reason


def runner_effect(w: World) -> None:
    """A runner reserving an effect over HTTP on a history that crossed review unapproved:
    refused before anything is sent, like a worker's."""
    w.cross_unapproved(status=RunStatus.RUNNING)
    body = {
        "idempotency_key": f"runner-{w.run.pk}",
        "action": "publish",
        "target": "gated/by-hand",
        "request_fingerprint": "f" * 64,
    }
    answer = w.answer("operations", body)
    assert (answer.status_code, answer.json()["code"]) == (409, "approval_required")
    assert not ExternalOperation.objects.filter(run=w.run).exists()


def expiry(w: World) -> None:
    request = w.pending()
    ApprovalRequest.objects.filter(pk=request.pk).update(
        expires_at=timezone.now() - timedelta(seconds=1)
    )
    assert approval_expire_due() == 1
    w.work()
    assert w.run.state == "review"


PATHS: dict[str, Callable[[World], None]] = {
    "worker": worker,
    "http_runner_commit": http_runner_commit,
    "code_commit": code_commit,
    "resume": resume,
    "retry": retry,
    "fork": fork,
    "grant": grant,
    "cancel_then_resume": cancel_then_resume,
    "approve": approve,
    "reject": reject,
    "rescue": rescue,
    "runner_effect": runner_effect,
    "expiry": expiry,
}
CROSSED_BY_HAND = {"resume", "retry", "fork", "grant", "rescue", "runner_effect"}


@pytest.mark.parametrize("path", PATHS)
def test_every_path_that_moves_a_run_is_held_to_the_approval_invariant(world, path):  # noqa: ANN001
    try:
        PATHS[path](world)
    except CairnError as refused:  # a service refusal is an answer too, never a way past
        assert refused.status in (403, 409, 422), refused
    assert shipped_unapproved(world.service) == []
    for run in Run.objects.filter(tenant=world.run.tenant):
        breaks = invariant_breaks(run)
        report = run_verify(tenant=run.tenant, run_id=run.pk)
        # verify is ok exactly when the invariant holds, and names each break
        assert report["ok"] == (not breaks), (breaks, report)
        for sequence in breaks:
            assert any(f"checkpoint {sequence} " in p for p in report["problems"])
        assert bool(breaks) == (run == world.run and path in CROSSED_BY_HAND)
