"""Requests a run can never use are closed: a cancelled run's at once, a finished run's by
the expiry sweep, so the waiting figure counts only runs that wait."""

from __future__ import annotations

import pytest
from django.test import Client

from approvals.models import ApprovalRequest, ApprovalStatus
from approvals.services import approval_expire_due
from checkpoints.models import Run, RunStatus
from runtime.services.cancel import run_cancel
from tenants.services import Actor
from tests.approvals_support import ask, at_review, draft, worker_run

pytestmark = pytest.mark.django_db


def waiting_figure(client: Client) -> float:
    for line in client.get("/metrics").text.splitlines():
        if line.startswith('cairn_approvals{state="waiting",tenant="acme"}'):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_cancelling_a_waiting_run_closes_its_request(acme, bob, carol):
    artifact = draft(acme)
    run = at_review(worker_run(acme, bob), artifact)
    request = ask(run, artifact, bob)
    run_cancel(tenant=acme, run_id=run.pk, reason="customer withdrew", actor=Actor(user=bob))
    request.refresh_from_db()
    assert request.status == ApprovalStatus.CLOSED
    assert "cancelled by bob" in request.status_reason
    assert not ApprovalRequest.objects.filter(status=ApprovalStatus.PENDING).exists()


def test_the_sweep_closes_requests_of_runs_that_finished_and_the_figure_counts_waiting_runs(
    acme, bob, client
):
    artifact = draft(acme)
    runs = [at_review(worker_run(acme, bob), artifact) for _ in range(3)]
    requests = [ask(run, artifact, bob) for run in runs]
    assert waiting_figure(client) == 3
    # A worker finished one and failed another while their requests were live.
    Run.objects.filter(pk=runs[0].pk).update(status=RunStatus.SUCCEEDED)
    Run.objects.filter(pk=runs[1].pk).update(status=RunStatus.FAILED)
    assert waiting_figure(client) == 1
    approval_expire_due()
    statuses = [ApprovalRequest.objects.get(pk=r.pk).status for r in requests]
    assert statuses == [ApprovalStatus.CLOSED, ApprovalStatus.CLOSED, ApprovalStatus.PENDING]
    assert waiting_figure(client) == 1
