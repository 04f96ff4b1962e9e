"""Approve with edits, the whole path in a real browser (issue 27, "Done when"): a worker runs
the demo research workflow to its approval state, which the reviewer group 'legal' decides
with a quorum of two; a real SMTP server on loopback receives both reviewers' messages; rita
edits the draft on the review page and approves her edit, and the page shows the quorum
restarted on the edited hash (1 of 2); sam approves the edited text; the run publishes the
edited artifact exactly once; the signed evidence bundle from the run page verifies offline
and fails after a one-byte change."""

from __future__ import annotations

import hashlib

import pytest
from playwright.sync_api import expect

import tests.runtime_workflows  # noqa: F401 - declares research_quorum in this process too
from approvals.models import ApprovalRequest, ApprovalStatus
from checkpoints.models import Checkpoint, Run, RunStatus
from checkpoints.services.artifacts import artifact_content
from runtime.services.runs import run_create
from tenants.reviewer_groups import reviewer_group_create, reviewer_group_member_add
from tenants.services import Actor, member_set_role
from tests.evidence_support import evidence_downloaded_and_checked
from tests.factories import UserFactory
from tests.smtp_support import PUBLIC_URL, smtp_worker_env
from tests.worker_fixtures import wait_for

pytestmark = [pytest.mark.worker, pytest.mark.django_db(transaction=True)]


def _reviewer(tenant, name: str):  # noqa: ANN001, ANN202
    user = UserFactory(username=name, email=f"{name}@example.org")
    member_set_role(tenant=tenant, user=user, role="reviewer", actor=Actor.system("test"))
    return user


def _link(smtp, address: str, request: ApprovalRequest) -> str:  # noqa: ANN001
    """The review page's path in the message to ``address`` about ``request``."""
    path = f"/approvals/{request.pk}/"
    wait_for(
        lambda: any(
            PUBLIC_URL + path in m.get_payload(decode=True).decode() for m in smtp.to(address)
        ),
        what=f"the message to {address} about request {request.pk}",
        timeout=120,
    )
    return path


def test_a_reviewer_edits_the_draft_the_quorum_restarts_and_the_edit_is_published_once(
    live_server,
    page,
    login,
    screenshot,
    acme,
    alice,
    bob,
    worker_factory,
    publishing_service,
    smtp_server,
    settings,
    tmp_path,
):  # noqa: ANN001
    settings.CAIRN_EVIDENCE_KEY_FILE = tmp_path / "home" / "evidence_signing_key.pem"
    settings.CAIRN_EVIDENCE_KEY_GENERATE = True
    rita, sam = _reviewer(acme, "rita"), _reviewer(acme, "sam")
    reviewer_group_create(tenant=acme, name="legal", actor=Actor(user=alice))
    for user in (rita, sam):
        reviewer_group_member_add(
            tenant=acme, name="legal", username=user.username, actor=Actor(user=alice)
        )
    worker_factory("w1", env=smtp_worker_env(smtp_server))
    run = run_create(
        tenant=acme,
        workflow_type="research_quorum",
        inputs={"question": "Why do hikers build cairns?"},
        budget={"max_attempts": 20, "max_tokens": 100000, "max_cost": 10.0},
        actor=Actor(user=bob),
    )
    first = wait_for(
        lambda: ApprovalRequest.objects.filter(run=run, status=ApprovalStatus.PENDING).first(),
        what="the run to ask for approval",
        timeout=180,
    )
    assert first.required_approvals == 2
    # 1. Both reviewers of the group are told, by a real SMTP server on loopback.
    rita_link = _link(smtp_server, "rita@example.org", first)
    _link(smtp_server, "sam@example.org", first)
    original = artifact_content(first.artifact).decode()
    edited = original.replace("\n\n", "\n\nReviewed by legal: stones are no signpost.\n\n", 1)
    edited_sha = hashlib.sha256(edited.encode()).hexdigest()

    # 2. rita edits the draft on the review page and approves her edit.
    login(page, rita)
    page.goto(live_server.url + rita_link)
    expect(page.locator("#quorum-progress")).to_have_text("0 of 2")
    expect(page.locator("#artifact-sha256")).to_have_text(first.artifact_sha256)
    page.get_by_text("Edit the text before approving it").click()  # opens the editor
    editor = page.get_by_label("Edited text")
    expect(editor).to_have_value(original)
    editor.fill(edited)
    page.get_by_role("button", name="Approve with edits").click()

    expect(page.get_by_role("status").first).to_contain_text("The quorum starts again")
    expect(page.locator("#quorum-progress")).to_contain_text("1 of 2; rita approved at ")
    expect(page.locator("#artifact-sha256")).to_have_text(edited_sha)
    expect(page.locator("#edited-from")).to_contain_text(first.artifact_sha256)
    expect(page.locator("#artifact-diff")).to_contain_text(
        "+Reviewed by legal: stones are no signpost."
    )
    screenshot(page, "approvals-approve-with-edits")
    second = ApprovalRequest.objects.get(run=run, status=ApprovalStatus.PENDING)
    assert second.artifact_sha256 == edited_sha and second.previous_id == first.pk
    assert ApprovalRequest.objects.get(pk=first.pk).status == ApprovalStatus.SUPERSEDED

    # 3. sam is told of the new request and approves the edited text.
    sam_link = _link(smtp_server, "sam@example.org", second)
    page.context.clear_cookies()
    login(page, sam)
    page.goto(live_server.url + sam_link)
    expect(page.locator("#artifact-sha256")).to_have_text(edited_sha)
    page.get_by_role("button", name="Approve", exact=True).click()
    expect(page.locator("#quorum-progress")).to_contain_text("2 of 2; rita approved at ")
    expect(page.locator("#run-progress [data-run-status]")).to_have_attribute(
        "data-run-status", RunStatus.SUCCEEDED, timeout=120_000
    )

    # 4. The edited artifact is published, exactly once.
    run = Run.objects.get(pk=run.pk)
    assert run.status == RunStatus.SUCCEEDED
    assert Checkpoint.objects.filter(run=run, step="publish").count() == 1
    stats = publishing_service.stats()
    assert stats["publications"] == 1
    (published,) = stats["payloads"].values()
    assert published["body"] == edited and published["draft_sha256"] == edited_sha
    second.refresh_from_db()
    assert second.status == ApprovalStatus.CONSUMED

    # 5. The signed evidence verifies offline, and fails after a one-byte change.
    page.context.clear_cookies()
    login(page, bob)
    bundle = evidence_downloaded_and_checked(
        page, f"{live_server.url}/runs/{run.pk}/", tmp_path, run.pk
    )
    assert edited_sha in bundle.read_text() and first.artifact_sha256 in bundle.read_text()
