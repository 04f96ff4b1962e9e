"""A review page left open while its request expires stops offering Approve and Reject,
says Expired (not Pending) and links to the request that replaced it."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from approvals.models import ApprovalStatus
from approvals.services import approval_expire_due
from tests.approvals_support import ask, at_review, draft, expire_now, worker_run

pytestmark = pytest.mark.django_db(transaction=True)


def test_an_open_review_page_turns_expired_and_points_to_the_new_request(
    live_server, page, login, settings, acme, bob, carol
):
    settings.CAIRN_CONSOLE_REFRESH_SECONDS = 1
    artifact = draft(acme)
    run = at_review(worker_run(acme, bob), artifact)
    request = ask(run, artifact, bob)
    login(page, carol)
    page.goto(f"{live_server.url}/approvals/{request.pk}/")
    decision = page.locator("#your-decision")
    expect(decision.get_by_role("button", name="Approve")).to_be_visible()

    expire_now(request)
    approval_expire_due()
    fresh = run.approval_requests.get(status=ApprovalStatus.PENDING)
    expect(page.locator("#approval-status [data-status]")).to_have_text("Expired")
    expect(decision.get_by_role("button", name="Approve")).to_have_count(0)
    expect(decision.get_by_role("button", name="Reject")).to_have_count(0)
    page.locator("#newer-request").click()
    expect(page).to_have_url(f"{live_server.url}/approvals/{fresh.pk}/")
    expect(page.locator("#your-decision").get_by_role("button", name="Approve")).to_be_visible()
