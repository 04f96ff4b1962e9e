"""The demo research run and its approval, end to end on real Celery worker subprocesses:
it waits for a hash-bound approval, a reviewer decides through the API or the review page,
and the run publishes exactly the approved draft once and succeeds (or ends on a reject).
A draft regenerated after the approval (a retried step) is not published under it."""

from __future__ import annotations

import re

import pytest
from django.test import Client

from approvals.models import ApprovalRequest, ApprovalStatus
from checkpoints.models import Checkpoint, ExternalOperation, Run, RunStatus
from checkpoints.services.reads import checkpoint_envelope, latest_envelope
from runtime.executor import run_advance
from runtime.services.retry import run_retry
from tenants.services import Actor
from tests.approvals_support import decide, start_demo
from tests.worker_fixtures import wait_for

pytestmark = pytest.mark.django_db(transaction=True)


def pending_request(run) -> ApprovalRequest:  # noqa: ANN001
    return wait_for(
        lambda: ApprovalRequest.objects.filter(run=run, status=ApprovalStatus.PENDING).first(),
        what=f"run {run.pk} to ask for approval",
        timeout=180,
    )


def settled(run, status: str) -> Run:  # noqa: ANN001
    wait_for(
        lambda: Run.objects.filter(pk=run.pk, status=status).exists(),
        what=f"run {run.pk} to be {status}",
        timeout=180,
    )
    return Run.objects.get(pk=run.pk)


def draft_ref(run) -> dict:  # noqa: ANN001
    refs = latest_envelope(run)["evidence"]["artifacts"]
    return next(ref for ref in refs if ref.get("name") == "draft")


def assert_published_once_under(run, request, service) -> None:  # noqa: ANN001
    """One publication at the provider, one confirmed operation, one accepted publish step,
    and what it published is exactly the approved draft."""
    assert service.stats()["publications"] == 1
    operation = ExternalOperation.objects.get(run=run, action="publish")
    assert operation.status == "confirmed" and operation.provider_operation_id
    publishes = Checkpoint.objects.filter(run=run, step="publish")
    assert publishes.count() == 1
    envelope = checkpoint_envelope(publishes.get())
    assert envelope["evidence"]["outputs"]["publish"]["draft_sha256"] == request.artifact_sha256
    approval = next(v for v in envelope["evidence"]["validators"] if v["name"] == "approval")
    assert approval["passed"] and request.artifact_sha256 in approval["detail"]
    assert envelope["control"]["approval_request_id"] == str(request.pk)
    request.refresh_from_db()
    assert request.status == ApprovalStatus.CONSUMED and request.consumed_at


@pytest.mark.worker
def test_the_demo_run_is_approved_through_the_api_publishes_once_and_succeeds(
    acme, bob, carol, api_as, worker_factory, publishing_service
):
    run = start_demo(acme, bob)
    worker_factory("w1")
    request = pending_request(run)
    run.refresh_from_db()
    assert run.status == RunStatus.WAITING_APPROVAL and run.state == "request_approval"
    ref = draft_ref(run)
    assert (str(request.artifact_id), request.artifact_sha256) == (ref["id"], ref["sha256"])
    assert request.run_version == run.version and request.action == "publish"
    assert request.requester == bob  # who started the run may not approve its publication

    api = api_as(carol, acme)
    queue = api.get("/api/v1/approvals?status=pending").json()["results"]
    assert [(r["id"], r["artifact_sha256"]) for r in queue] == [
        (str(request.pk), request.artifact_sha256)
    ]
    response = api.post(
        f"/api/v1/approvals/{request.pk}/decision",
        {"decision": "approve", "artifact_sha256": request.artifact_sha256, "comment": "ok"},
        format="json",
    )
    assert response.status_code == 200, response.content

    run = settled(run, RunStatus.SUCCEEDED)
    assert run.state == "done"
    assert_published_once_under(run, request, publishing_service)


@pytest.mark.worker
def test_the_demo_run_is_approved_on_the_review_page_publishes_once_and_succeeds(
    acme, bob, carol, worker_factory, publishing_service
):
    run = start_demo(acme, bob)
    worker_factory("w1")
    request = pending_request(run)
    client = Client()
    client.force_login(carol)
    page = client.get(f"/approvals/{request.pk}/").text
    shown = re.search(r'name="artifact_sha256" value="([0-9a-f]{64})"', page).group(1)
    assert shown == request.artifact_sha256
    response = client.post(
        f"/approvals/{request.pk}/decision",
        {"decision": "approve", "artifact_sha256": shown, "comment": "read it all"},
    )
    assert response.status_code == 302

    run = settled(run, RunStatus.SUCCEEDED)
    assert_published_once_under(run, request, publishing_service)


@pytest.mark.worker
def test_a_rejected_demo_run_ends_in_its_rejected_state_with_the_comment(
    acme, bob, carol, api_as, worker_factory, publishing_service
):
    run = start_demo(acme, bob)
    worker_factory("w1")
    request = pending_request(run)
    response = api_as(carol, acme).post(
        f"/api/v1/approvals/{request.pk}/decision",
        {
            "decision": "reject",
            "artifact_sha256": request.artifact_sha256,
            "comment": "Source 2 is not cited.",
        },
        format="json",
    )
    assert response.status_code == 200
    run = settled(run, RunStatus.FAILED)
    assert run.state == "rejected"
    assert "Source 2 is not cited." in run.status_reason
    assert not Checkpoint.objects.filter(run=run, step="publish").exists()
    assert publishing_service.stats()["publications"] == 0


def advance_until_waiting(run) -> Run:  # noqa: ANN001
    """Drive the run with the real executor in this process until it waits for approval."""
    for _ in range(10):
        run.refresh_from_db()
        if (
            run.status == RunStatus.WAITING_APPROVAL
            and ApprovalRequest.objects.filter(run=run, status=ApprovalStatus.PENDING).exists()
        ):
            return run
        run_advance(run_id=run.pk, expected_version=run.version, owner="test-executor")
    pytest.fail(f"run {run.pk} did not reach its approval wait")


def test_a_draft_regenerated_after_approval_is_not_published_under_the_old_approval(
    acme, bob, carol, alice
):
    run = advance_until_waiting(start_demo(acme, bob))
    old = ApprovalRequest.objects.get(run=run, status=ApprovalStatus.PENDING)

    decide(old, carol)
    # Before a worker used the approval, an operator had the draft written again.
    run_retry(
        tenant=acme,
        run_id=run.pk,
        step="draft_answer",
        reason="redo the draft",
        actor=Actor(user=alice),
    )
    run = advance_until_waiting(run)

    old.refresh_from_db()
    assert old.status == ApprovalStatus.SUPERSEDED  # never consumed
    new = ApprovalRequest.objects.get(run=run, status=ApprovalStatus.PENDING)
    assert new.run_version == run.version > old.run_version
    assert new.artifact_sha256 == draft_ref(run)["sha256"]
    assert run.state == "request_approval"
    assert not Checkpoint.objects.filter(run=run, step="publish").exists()
