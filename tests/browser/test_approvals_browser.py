"""A reviewer in a real browser (headless Chromium): signs in, opens the queue, sees the hash
of the draft under review, approves it, and sees the run move on to the end on a real
worker."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from approvals.models import ApprovalRequest, ApprovalStatus
from checkpoints.models import Checkpoint, Run, RunStatus
from tests.approvals_support import start_demo
from tests.worker_fixtures import wait_for

pytestmark = [pytest.mark.worker, pytest.mark.django_db(transaction=True)]


def test_a_reviewer_approves_the_demo_draft_in_the_browser_and_the_run_moves_on(
    live_server, page, login, screenshot, acme, bob, carol, worker_factory, publishing_service
):
    run = start_demo(acme, bob)
    worker_factory("w1")
    request = wait_for(
        lambda: ApprovalRequest.objects.filter(run=run, status=ApprovalStatus.PENDING).first(),
        what="the demo run to ask for approval",
        timeout=180,
    )
    sha = request.artifact_sha256

    login(page, carol)
    page.get_by_role("navigation", name="Main").get_by_role("link", name="Approvals").click()
    row = page.locator(f"#approval-{request.pk}")
    expect(row.locator("code.sha")).to_have_text(sha)
    expect(row).to_contain_text("publish")
    screenshot(page, "approvals-queue")

    row.get_by_role("link", name="Review").click()
    expect(page.get_by_role("heading", name="Review: publish")).to_be_visible()
    expect(page.locator("#artifact-sha256")).to_have_text(sha)
    expect(page.locator("#artifact-content h3")).to_contain_text("Why do hikers build cairns?")
    expect(page.locator("#run-progress [data-run-status]")).to_have_attribute(
        "data-run-status", RunStatus.WAITING_APPROVAL
    )
    page.get_by_label("Comment").fill("Every claim is cited.")
    page.get_by_role("button", name="Approve").click()

    expect(page.get_by_role("status").first).to_contain_text("Approved.")
    # The status line refreshes itself: the run leaves its approval wait and finishes.
    expect(page.locator("#run-progress [data-run-status]")).to_have_attribute(
        "data-run-status", RunStatus.SUCCEEDED, timeout=120_000
    )
    expect(page.locator("#run-progress [data-run-state]")).to_have_text("done")
    screenshot(page, "approvals-review-approved")

    run = Run.objects.get(pk=run.pk)
    assert run.status == RunStatus.SUCCEEDED
    assert Checkpoint.objects.filter(run=run, step="publish").count() == 1
    assert publishing_service.stats()["publications"] == 1
    request.refresh_from_db()
    assert request.status == ApprovalStatus.CONSUMED
    assert list(request.decisions.values_list("approver__username", "artifact_sha256")) == [
        ("carol", sha)
    ]
