"""What an operator sees and can do about a run whose approval was decided but whose command
was lost: resume sends the command again (the version stays, the approval is bound to it),
a run still waiting for a decision is refused with a sentence naming the request, and an
approved request that expires unused is never reported as "expired with no decision"."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from approvals.models import ApprovalRequest, ApprovalStatus
from approvals.services.expiry import approval_expire_due
from checkpoints.models import OutboxMessage, Run, RunStatus
from tests.actions_support import audit_events
from tests.approvals_support import decide
from tests.liveness_support import deliver, lose_every_command, waiting

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _shipped(settings, publishing_service):  # noqa: ANN001
    settings.CAIRN_LEASE_SECONDS = 60
    settings.CAIRN_PUBLISHING_URL = publishing_service.url


@pytest.fixture
def approved(acme, bob, carol) -> Run:  # noqa: ANN001
    """A run whose approval was granted, and whose command the broker lost."""
    run = waiting(acme, bob)
    decide(ApprovalRequest.objects.get(run=run), carol)
    lose_every_command(run)
    run.refresh_from_db()
    return run


def resume(api_as, bob, acme, run: Run):  # noqa: ANN001, ANN201
    return api_as(bob, acme).post(
        f"/api/v1/runs/{run.pk}/actions/resume",
        {"expected_version": run.version, "reason": "the run sat still after the approval"},
        format="json",
    )


def test_resume_sends_an_approved_runs_lost_command_again(
    api_as, bob, acme, approved, publishing_service
):  # noqa: ANN001
    response = resume(api_as, bob, acme, approved)
    assert response.status_code == 200, response.json()
    assert (response.json()["status"], response.json()["version"]) == (
        RunStatus.WAITING_APPROVAL,
        approved.version,  # the approval is bound to it: it does not move
    )
    queued = OutboxMessage.objects.filter(run=approved, sent_at__isnull=True)
    assert [m.payload["expected_version"] for m in queued] == [approved.version]
    (event,) = audit_events(approved, "run.resume")
    assert event.details["command_sent_again"] is True
    assert event.reason == "the run sat still after the approval"
    deliver(approved)
    approved.refresh_from_db()
    assert approved.status == RunStatus.SUCCEEDED
    assert publishing_service.stats()["publications"] == 1


def test_resume_of_a_run_still_waiting_for_a_decision_names_the_request(api_as, bob, acme):  # noqa: ANN001
    run = waiting(acme, bob)
    request = ApprovalRequest.objects.get(run=run)
    response = resume(api_as, bob, acme, run)
    assert (response.status_code, response.json()["code"]) == (409, "action_not_allowed")
    detail = response.json()["detail"]
    assert f"approval request {request.pk} (pending, open until" in detail
    assert "Decide it, and the run goes on by itself" in detail
    assert not OutboxMessage.objects.filter(
        run=run, kind="run.resume", sent_at__isnull=True
    ).exists()


def test_the_console_confirms_what_a_resume_of_an_approved_run_does(bob, approved):  # noqa: ANN001
    client = Client()
    client.force_login(bob)
    url = f"/runs/{approved.pk}/actions/resume/"
    page = client.post(url, {"version": approved.version, "reason": "stuck"}).content.decode()
    assert "the command that carries the decision out was lost" in page
    assert "Resuming sends that command again, at the same version" in page
    done = client.post(url, {"version": approved.version, "reason": "stuck", "confirm": "1"})
    assert done.status_code == 302
    assert OutboxMessage.objects.filter(run=approved, sent_at__isnull=True).count() == 1


def test_an_approved_request_that_expires_unused_is_not_called_undecided(approved):
    request = ApprovalRequest.objects.get(run=approved)
    ApprovalRequest.objects.filter(pk=request.pk).update(
        expires_at=timezone.now() - timedelta(seconds=1)
    )
    assert approval_expire_due() == 1
    approved.refresh_from_db()
    assert "with no decision" not in approved.status_reason
    assert "approval granted at" in approved.status_reason
    assert "before the run used it; a new request was raised" in approved.status_reason
    assert ApprovalRequest.objects.filter(run=approved, status=ApprovalStatus.PENDING).exists()
