"""The walkthrough's defects (issue 29, item 7) as a person meets them in Chromium."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from approvals.models import ApprovalStatus
from approvals.services import approval_expire_due
from checkpoints.models import Checkpoint, Run
from checkpoints.services.artifacts import artifact_store
from checkpoints.services.checkpoints import CommitRequest, checkpoint_commit
from tenants.models import AuditEvent
from tenants.services import Actor, audit_record
from tests.approvals_support import ask, at_review, draft, expire_now, worker_run
from tests.console_data import story_run

pytestmark = pytest.mark.django_db(transaction=True)


def test_the_parent_field_stays_the_parent_when_comparing_with_another(
    live_server, page, login, bob, acme, workflow
):
    run = story_run(acme, bob)
    login(page, bob)
    page.goto(f"{live_server.url}/runs/{run.pk}/checkpoints/3/?against=1")
    parent = page.locator("dt:text-is('Parent') + dd")
    expect(parent).to_have_text("#2")
    expect(page.locator("#group-position table.diff thead")).to_contain_text("#1")


def test_an_expired_request_says_expired_and_then_links_its_renewal(
    live_server, page, login, settings, acme, bob, carol
):
    settings.CAIRN_CONSOLE_REFRESH_SECONDS = 1
    artifact = draft(acme)
    run = at_review(worker_run(acme, bob), artifact)
    request = ask(run, artifact, bob)
    expire_now(request)
    login(page, carol)
    page.goto(f"{live_server.url}/approvals/{request.pk}/")
    status = page.locator("#approval-status")
    expect(status).to_contain_text("none: the request has expired")
    expect(status).not_to_contain_text("pending")
    expect(status).to_contain_text("A new request is raised")
    approval_expire_due()
    fresh = run.approval_requests.get(status=ApprovalStatus.PENDING)
    page.locator("#newer-request").click()  # the poll brings the link in
    expect(page).to_have_url(f"{live_server.url}/approvals/{fresh.pk}/")


def test_an_empty_reject_reason_is_named_at_the_field_which_takes_focus(
    live_server, page, login, acme, bob, carol
):
    artifact = draft(acme)
    run = at_review(worker_run(acme, bob), artifact)
    request = ask(run, artifact, bob)
    login(page, carol)
    page.goto(f"{live_server.url}/approvals/{request.pk}/")
    page.locator("#your-decision").get_by_role("button", name="Reject").click()
    comment = page.get_by_label("Comment (required to reject)")
    expect(comment).to_be_focused()
    expect(comment).to_have_attribute("aria-invalid", "true")
    expect(page.locator("#id_comment_error")).to_contain_text("Give a reason for the rejection")
    expect(page.locator(".refusal")).to_have_count(0)  # not reported far from the field
    page.console_errors.clear()  # the refused form answered 400, as documented
    comment.fill("The second claim has no source.")
    page.locator("#your-decision").get_by_role("button", name="Reject").click()
    expect(page.locator(".messages")).to_contain_text("Rejected.")
    request.refresh_from_db()
    assert request.status == ApprovalStatus.REJECTED


def test_the_ignored_filters_sentence_reads_cleanly(live_server, page, login, bob, acme, workflow):
    login(page, bob)
    page.goto(f"{live_server.url}/runs/?restored_more_than=-3&state=review")
    left_out = page.locator("#filters-left-out")
    expect(left_out).to_have_text(
        "Left out, so the runs below are not filtered by them: Restored more than "
        "(Ensure this value is greater than or equal to 0)."
    )


def test_at_375px_the_runs_list_shows_status_and_folds_the_filters(
    live_server, page, login, bob, acme, workflow
):
    story_run(acme, bob)
    page.set_viewport_size({"width": 375, "height": 812})
    login(page, bob)
    page.goto(f"{live_server.url}/runs/")
    filters = page.locator("#run-filters")
    expect(filters).not_to_have_attribute("open", "")
    expect(page.get_by_label("Search run id or objective")).to_be_hidden()
    status = page.locator("table.runs th", has_text="Status")
    expect(status).to_be_visible()
    box = status.bounding_box()
    assert box["x"] + box["width"] <= 375 and box["y"] + box["height"] <= 812
    page.locator("#run-filters > summary").click()  # unfolds on demand
    expect(page.get_by_label("Search run id or objective")).to_be_visible()
    # Wide, it starts open as before.
    page.set_viewport_size({"width": 1280, "height": 900})
    page.reload()
    expect(page.get_by_label("Search run id or objective")).to_be_visible()


def test_the_hold_form_takes_the_8_characters_it_asks_for(
    live_server, page, login, alice, acme, workflow
):
    run = story_run(acme, alice)
    login(page, alice)
    page.goto(f"{live_server.url}/retention/")
    run_id = page.locator("#run-hold-id")
    run_id.fill(str(run.pk)[:7])
    page.locator("#run-hold-reason").fill("litigation")
    page.locator("#run-hold-submit").click()
    # The browser stops a shorter id with the same rule the server has.
    assert "at least 8" in run_id.evaluate("e => e.validationMessage") or run_id.evaluate(
        "e => e.validity.tooShort"
    )
    run_id.fill(str(run.pk)[:8])
    page.locator("#run-hold-submit").click()
    expect(page.locator(".messages")).to_contain_text(f"Run {str(run.pk)[:8]} is on legal hold.")
    assert Run.objects.get(pk=run.pk).legal_hold


def test_the_cancel_preview_says_the_pending_approval_is_closed(
    live_server, page, login, acme, bob, alice
):
    artifact = draft(acme)
    run = at_review(worker_run(acme, bob), artifact)
    ask(run, artifact, bob)
    login(page, alice)
    page.goto(f"{live_server.url}/runs/{run.pk}/")
    actions = page.locator("#run-actions")
    actions.get_by_role("button", name="Cancel…").click()
    actions.get_by_label("Reason").fill("wrong question")
    actions.get_by_role("button", name="Review what will happen").click()
    expect(actions.locator(".action-summary")).to_contain_text(
        "Its pending approval request is closed"
    )
    actions.get_by_role("button", name="Cancel the run").click()
    expect(page.get_by_role("status")).to_contain_text("Cancelled.")
    assert run.approval_requests.get().status == ApprovalStatus.CLOSED


def test_a_reviewer_opens_a_cited_source_from_the_review_page(
    live_server, page, login, acme, bob, carol
):
    source, _ = artifact_store(
        tenant=acme,
        data=b"Cairns mark routes above the tree line.",
        media_type="text/plain",
        kind="source",
    )
    text = (
        "# Cairns\n\nThey mark routes [1].\n\n## Sources\n\n"
        f"[1] trail-guide (sha256 {source.sha256[:12]})\n"
    )
    artifact = draft(acme, text)
    run = worker_run(acme, bob)
    run = at_review(run, artifact)
    # The checkpoint under review holds the source as evidence too.
    run.refresh_from_db()
    checkpoint_commit(
        tenant=acme,
        run_id=run.pk,
        request=CommitRequest(
            expected_version=run.version,
            state="review",
            step="",
            envelope={
                "evidence": {
                    "artifacts": [
                        {"id": str(artifact.id), "sha256": artifact.sha256, "name": "draft"},
                        {
                            "id": str(source.id),
                            "sha256": source.sha256,
                            "name": "source:trail-guide",
                        },
                    ],
                    "validators": [],
                }
            },
            actor=Actor.system("test driver"),
        ),
    )
    request = ask(run, artifact, bob)
    login(page, carol)
    page.goto(f"{live_server.url}/approvals/{request.pk}/")
    page.locator("#cited-sources").get_by_role("link", name="[1] trail-guide").click()
    expect(page.locator("#source-content")).to_contain_text("Cairns mark routes above")
    expect(page.locator("#source-sha256")).to_have_text(source.sha256)
    assert AuditEvent.objects.filter(
        action="artifact.read", target__contains=str(source.pk)
    ).exists()
    page.get_by_role("link", name="Back to the review").click()
    expect(page).to_have_url(f"{live_server.url}/approvals/{request.pk}/")


def test_the_run_timeline_and_audit_trail_page_on(live_server, page, login, bob, acme, workflow):
    run = story_run(acme, bob)
    for index in range(205):
        audit_record(
            tenant=acme,
            actor=Actor.system("t"),
            action="run.note",
            run_id=run.pk,
            target=f"note {index}",
        )
    login(page, bob)
    page.goto(f"{live_server.url}/runs/{run.pk}/")
    expect(page.locator("#audit tbody tr")).to_have_count(100)
    pages = page.locator("#audit-pages")
    pages.get_by_role("link", name="Older events →").click()
    expect(page.locator("#audit tbody tr")).to_have_count(100)
    page.locator("#audit-pages").get_by_role("link", name="Older events →").click()
    expect(page.locator("#audit")).to_contain_text("note 0")
    expect(page.locator("#audit-pages").get_by_role("link", name="Older events →")).to_have_count(0)
    page.locator("#audit-pages").get_by_role("link", name="Newest events").click()
    expect(page.locator("#audit")).to_contain_text("note 204")
    assert Checkpoint.objects.filter(run=run).count() < 200  # the timeline pager is tested below
