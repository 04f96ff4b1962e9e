"""An operator in a real browser cannot move a run past its approval: the retry form offers
only steps the run has reached, a forged choice is refused, and the publishing service (a
real subprocess behind a real worker) sees no publication."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from approvals.models import ApprovalRequest, ApprovalStatus
from checkpoints.models import Checkpoint, Run, RunStatus
from tests.approvals_support import start_demo
from tests.worker_fixtures import wait_for

pytestmark = [pytest.mark.worker, pytest.mark.django_db(transaction=True)]


def pending(run: Run, **filters) -> ApprovalRequest:  # noqa: ANN003
    return wait_for(
        lambda: ApprovalRequest.objects.filter(
            run=run, status=ApprovalStatus.PENDING, **filters
        ).first(),
        what=f"run {run.pk} to ask for approval",
        timeout=180,
    )


def test_the_retry_form_never_moves_a_waiting_run_past_its_approval(
    live_server, page, login, screenshot, acme, bob, worker_factory, publishing_service
):
    run = start_demo(acme, bob)
    worker_factory("w1")
    request = pending(run)
    run.refresh_from_db()
    assert run.status == RunStatus.WAITING_APPROVAL

    login(page, bob)
    page.goto(f"{live_server.url}/runs/{run.pk}/")
    actions = page.locator("#run-actions")
    actions.get_by_role("button", name="Retry a step…").click()
    step = actions.get_by_label("Step to run again")
    # Only the steps the run has been at; publish lies past the approval it waits for.
    expect(step.locator("option")).to_have_text(
        ["collect_sources", "extract_claims", "draft_answer", "validate_citations"]
    )
    # A forged choice (what a stale page offered) is refused before anything happens.
    step.evaluate(
        "el => { const o = document.createElement('option'); o.value = 'publish';"
        " o.text = 'publish'; el.appendChild(o); el.value = 'publish'; }"
    )
    actions.get_by_label("Reason").fill("the reviewer is on holiday")
    actions.get_by_role("button", name="Review what will happen").click()
    expect(actions).to_contain_text("Select a valid choice")
    expect(actions.get_by_role("button", name="Run the step again")).to_have_count(0)
    screenshot(page, "retry-past-approval-refused")

    # A retry it does offer goes back before the approval: the worker runs the draft again
    # and the run asks again, once, with the earlier request superseded.
    step.select_option("draft_answer")
    actions.get_by_role("button", name="Review what will happen").click()
    expect(actions).to_contain_text("step draft_answer runs again")
    expect(actions).to_contain_text("is closed")
    actions.get_by_role("button", name="Run the step again").click()
    expect(page.get_by_role("status").first).to_contain_text("Step draft_answer will run again")
    request.refresh_from_db()
    assert request.status == ApprovalStatus.SUPERSEDED
    newer = pending(run, created_at__gt=request.created_at)
    run.refresh_from_db()
    assert run.status == RunStatus.WAITING_APPROVAL and run.state == "request_approval"
    assert newer.run_version == run.version
    assert not Checkpoint.objects.filter(run=run, step="publish").exists()
    assert publishing_service.stats()["publications"] == 0
