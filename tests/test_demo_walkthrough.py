"""Regressions found by walking through the `make run` demo in a browser: a reviewer is not
offered a link to a page their role refuses, a superseded approval says what replaced it,
the run page says when the run moved on since it loaded, and a rejected demo run cannot be
"resumed" into a final state where nothing would ever run."""

from __future__ import annotations

import pytest
from django.test import Client
from django.urls import reverse

from approvals.models import ApprovalRequest, ApprovalStatus
from cairn.errors import ActionNotAllowed, ApprovalStale
from checkpoints.models import Run, RunStatus
from runtime.executor import run_advance
from runtime.services.actions import run_resume
from tenants.services import Actor
from tests.approvals_support import ask, at_review, decide, draft, move, start_demo
from tests.console_data import story_run

pytestmark = pytest.mark.django_db


def signed_in(user) -> Client:  # noqa: ANN001
    client = Client()
    client.force_login(user)
    return client


# --- the review page -----------------------------------------------------------------------
@pytest.fixture
def pending(run, bob) -> ApprovalRequest:  # noqa: ANN001
    artifact = draft(run.tenant)
    return ask(at_review(run, artifact), artifact, bob)


def test_a_reviewer_is_not_offered_a_link_to_the_run_page_they_may_not_open(pending, carol):
    run_page = reverse("console:run_detail", args=[pending.run_id])
    html = signed_in(carol).get(f"/approvals/{pending.pk}/").content.decode()
    assert str(pending.run_id) in html
    assert f'href="{run_page}"' not in html
    assert signed_in(carol).get(run_page).status_code == 403  # why the link would mislead


def test_an_admin_who_may_operate_gets_the_link_to_the_run_page(pending, alice):
    run_page = reverse("console:run_detail", args=[pending.run_id])
    html = signed_in(alice).get(f"/approvals/{pending.pk}/").content.decode()
    assert f'href="{run_page}"' in html


def test_a_request_superseded_by_one_for_the_same_draft_does_not_claim_the_draft_changed(
    pending, bob, carol
):
    # The run asks again for the very same draft (a retried step, a restore).
    newer = ask(move(pending.run, "review"), pending.artifact, bob)
    with pytest.raises(ApprovalStale) as caught:
        decide(pending, carol)
    detail = caught.value.detail
    assert "draft changed" not in detail
    assert f"new request for artifact {newer.artifact_sha256[:12]}" in detail
    assert "nothing was decided" in detail


# --- the run page's snapshot -----------------------------------------------------------------
@pytest.fixture
def story(acme, bob, workflow) -> Run:  # noqa: ANN001
    return story_run(acme, bob)


def test_the_snapshot_poll_carries_the_version_the_page_was_loaded_at(bob, story):
    html = signed_in(bob).get(reverse("console:run_detail", args=[story.pk])).content.decode()
    snapshot = reverse("console:run_snapshot", args=[story.pk])
    assert f'hx-get="{snapshot}?seen={story.version}"' in html
    assert "data-snapshot-moved" not in html


def test_the_snapshot_says_when_the_run_moved_on_since_the_page_loaded(bob, story):
    loaded = story.version
    moved = move(story, "publish")
    response = signed_in(bob).get(
        reverse("console:run_snapshot", args=[story.pk]),
        {"seen": loaded},
        HTTP_HX_REQUEST="true",
    )
    fragment = response.content.decode()
    assert "data-snapshot-moved" in fragment
    assert f"moved on from version {loaded} to {moved.version}" in fragment
    # The cards come with it, so the next poll compares with the version now shown.
    assert f"?seen={moved.version}" in fragment


def test_the_snapshot_says_nothing_while_the_run_is_at_the_loaded_version(bob, story):
    response = signed_in(bob).get(
        reverse("console:run_snapshot", args=[story.pk]), {"seen": story.version}
    )
    assert "data-snapshot-moved" not in response.content.decode()


# --- resuming a rejected demo run ------------------------------------------------------------
def rejected_demo_run(acme, bob, carol) -> Run:  # noqa: ANN001
    """The demo research run, driven by the real executor in this process, rejected by a
    reviewer: it fails in its final state ``rejected``."""
    run = start_demo(acme, bob)
    for _ in range(12):
        run.refresh_from_db()
        request = ApprovalRequest.objects.filter(run=run, status=ApprovalStatus.PENDING).first()
        if request is not None:
            decide(request, carol, "reject", comment="Source 2 is not cited.")
        elif run.status == RunStatus.FAILED:
            return run
        run.refresh_from_db()
        run_advance(run_id=run.pk, expected_version=run.version, owner="test-executor")
    pytest.fail(f"run {run.pk} did not end rejected")


def test_a_rejected_demo_run_is_not_resumed_into_its_final_state(acme, bob, carol):
    run = rejected_demo_run(acme, bob, carol)
    assert run.state == "rejected"
    with pytest.raises(ActionNotAllowed) as caught:
        run_resume(
            tenant=acme,
            run_id=run.pk,
            expected_version=run.version,
            reason="try again",
            actor=Actor(user=bob),
        )
    assert "ended in state rejected" in caught.value.detail
    assert "Retry a named step or fork" in caught.value.detail
    after = Run.objects.get(pk=run.pk)
    assert (after.status, after.version) == (RunStatus.FAILED, run.version)  # nothing written


def test_the_console_offers_retry_and_fork_but_not_resume_for_a_rejected_run(acme, bob, carol):
    run = rejected_demo_run(acme, bob, carol)
    html = signed_in(bob).get(reverse("console:run_detail", args=[run.pk])).content.decode()
    assert 'data-action="retry"' in html and 'data-action="fork"' in html
    assert 'data-action="resume"' not in html
