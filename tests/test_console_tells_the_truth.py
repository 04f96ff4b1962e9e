"""Pages stop offering what the server refuses: approval pages that can no longer be
decided, a resume preview that accounts open operations and budgets, status reasons after a
grant or a recorded outcome, grant budget only where there is a limit."""

from __future__ import annotations

import re

import pytest
from django.test import Client

from approvals.models import ApprovalStatus
from checkpoints.models import RunStatus
from runtime.services.actions import run_grant_budget
from runtime.services.operations import operation_record_outcome
from tenants.services import Actor
from tests.actions_support import advance, operation, worker_run
from tests.approvals_support import ask, at_review, draft, expire_now
from tests.approvals_support import worker_run as approvals_run

pytestmark = pytest.mark.django_db


def signed_in(user) -> Client:  # noqa: ANN001
    client = Client()
    client.force_login(user)
    return client


def test_an_expired_request_page_offers_no_decision_and_links_to_the_new_one(acme, bob, carol):
    artifact = draft(acme)
    run = at_review(approvals_run(acme, bob), artifact)
    old = ask(run, artifact, bob)
    carol_page = signed_in(carol)
    expire_now(old)
    # Before the sweep: the page says expired, not Pending, and offers no buttons.
    html = carol_page.get(f"/approvals/{old.pk}/").content.decode()
    assert 'data-status="expired"' in html and ">Pending<" not in html
    assert 'value="approve"' not in html
    # The status poll replaces the decision form of a page loaded earlier.
    poll = carol_page.get(f"/approvals/{old.pk}/status", HTTP_HX_REQUEST="true").content.decode()
    assert 'id="your-decision" hx-swap-oob="true"' in poll and 'value="approve"' not in poll

    # A decision posted from a stale tab: refused with a readable time and the new request.
    response = carol_page.post(
        f"/approvals/{old.pk}/decision",
        {"decision": "approve", "artifact_sha256": old.artifact_sha256, "comment": ""},
    )
    assert response.status_code == 409
    html = response.content.decode()
    assert re.search(r"expired at \d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC", html)
    assert "+00:00" not in html
    new = run.approval_requests.get(status=ApprovalStatus.PENDING)
    assert f'href="/approvals/{new.pk}/" id="newer-request"' in html


def test_a_superseded_request_page_offers_no_decision(acme, bob, carol):
    artifact = draft(acme)
    run = at_review(approvals_run(acme, bob), artifact)
    old = ask(run, artifact, bob)
    new = ask(run, draft(acme, "# another draft\n"), bob)
    html = signed_in(carol).get(f"/approvals/{old.pk}/").content.decode()
    assert 'data-status="superseded"' in html
    assert 'value="approve"' not in html and 'value="reject"' not in html
    assert f'href="/approvals/{new.pk}/" id="newer-request"' in html


def test_the_resume_preview_names_unknown_operations_and_never_contradicts_a_refusal(acme, bob):
    console = signed_in(bob)
    run = advance(worker_run(acme, bob, budget={"max_attempts": 5}), bob, "draft_answer")
    run = advance(run, bob, "draft_answer", status="paused_for_review")
    operation(run, "publish-7", "unknown")
    body = {"version": run.version, "reason": "go on"}
    html = console.post(f"/runs/{run.pk}/actions/resume/", body).content.decode()
    assert "settles operation(s) publish-7 (unknown)" in html

    spent = advance(
        worker_run(acme, bob, budget={"max_attempts": 1}),
        bob,
        "draft_answer",
        status="failed",
        envelope={"budgets": {"attempts_used": 1}},
    )
    body = {"version": spent.version, "reason": "go on"}
    html = console.post(f"/runs/{spent.pk}/actions/resume/", body).content.decode()
    assert "It cannot be done now" in html and "budget" in html
    assert "to running" not in html and "Resume the run</button>" not in html


def test_status_reasons_follow_a_grant_and_a_recorded_outcome(acme, bob):
    run = advance(
        worker_run(acme, bob, budget={"max_attempts": 1}),
        bob,
        "draft_answer",
        status="failed",
        status_reason="budget exhausted: attempts used 1 of 1",
        envelope={"budgets": {"attempts_used": 1}},
    )
    run = run_grant_budget(
        tenant=acme, run_id=run.pk, attempts=2, reason="one more go", actor=Actor(user=bob)
    )
    assert "exhausted" not in run.status_reason
    assert run.status_reason == "budget granted by bob (attempts +2); resume the run to continue"

    paused = advance(worker_run(acme, bob), bob, "draft_answer", status="paused_for_review")
    operation(paused, "publish-8", "unknown")
    operation(paused, "publish-9", "unknown")
    operation_record_outcome(
        tenant=acme,
        run_id=paused.pk,
        idempotency_key="publish-8",
        outcome="failed",
        reason="the provider has no such post",
        actor=Actor(user=bob),
    )
    paused.refresh_from_db()
    assert paused.status == RunStatus.PAUSED_FOR_REVIEW
    assert paused.status_reason == (
        "outcome of publish-8 recorded as failed by bob; 1 operation(s) still without a "
        "known outcome"
    )


def test_grant_budget_is_offered_only_on_runs_with_limits(acme, bob):
    console = signed_in(bob)
    unlimited = advance(worker_run(acme, bob), bob, "draft_answer", status="failed")
    limited = advance(
        worker_run(acme, bob, budget={"max_tokens": 10}), bob, "draft_answer", status="failed"
    )
    assert 'data-action="grant_budget"' not in console.get(f"/runs/{unlimited.pk}/").text
    assert 'data-action="grant_budget"' in console.get(f"/runs/{limited.pk}/").text
    form = console.get(f"/runs/{limited.pk}/actions/grant_budget/").text
    assert 'name="tokens"' in form and 'name="attempts"' not in form
