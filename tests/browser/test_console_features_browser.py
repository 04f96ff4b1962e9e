"""Features a console user expects, in a real browser: a diff between any two checkpoints
(per-checkpoint identity fields are not shown as changes), starting a run, a reviewer's
own decision history, and a 404 that says which of your tenants a run is in."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from checkpoints.models import Run
from checkpoints.services.workflows import workflow_register
from tenants.services import Actor, member_set_role
from tests.approvals_support import ask, at_review, decide, draft
from tests.approvals_support import worker_run as approvals_run
from tests.console_data import plain_run, story_run
from tests.factories import SIMPLE_DEFINITION

pytestmark = pytest.mark.django_db(transaction=True)


def test_two_chosen_checkpoints_are_compared_without_identity_noise(
    live_server, page, login, bob, acme, workflow
):
    run = story_run(acme, bob)
    login(page, bob)
    page.goto(f"{live_server.url}/runs/{run.pk}/checkpoints/{run.checkpoint_sequence}/")
    # Against its parent: the identity group lists no change (checkpoint id, sequence and
    # parent differ for every checkpoint), the position does.
    expect(page.locator("#group-identity")).to_contain_text("Unchanged since the parent.")
    expect(page.locator("#group-position table.diff")).to_be_visible()
    page.get_by_label("Compare with").select_option("1")
    page.get_by_role("button", name="Compare").click()
    expect(page).to_have_url(f"{live_server.url}/runs/{run.pk}/checkpoints/3/?against=1")
    position = page.locator("#group-position table.diff")
    expect(position.locator("thead")).to_contain_text("#1")
    expect(position).to_contain_text("collect_sources")  # the state at #1
    expect(page.locator("#group-identity")).to_contain_text("Unchanged against #1.")
    expect(page.locator("#group-evidence table.diff")).to_be_visible()


def test_an_operator_starts_a_run_from_the_console(live_server, page, login, bob, acme, workflow):
    login(page, bob)
    page.goto(f"{live_server.url}/runs/")
    page.get_by_role("link", name="Start a run").click()
    page.get_by_label("Workflow").select_option("research@1")
    page.get_by_label("Inputs (JSON object)").fill('{"question": oops}')
    page.get_by_role("button", name="Start the run").click()
    expect(page.locator("#id_inputs_error")).to_contain_text("This is not JSON")
    assert not Run.objects.exists()
    page.console_errors.clear()  # the refused form answered 400, as documented
    page.get_by_label("Inputs (JSON object)").fill('{"question": "Why cairns?"}')
    page.get_by_label("Objective (optional)").fill("ticket-42")
    page.get_by_role("button", name="Start the run").click()
    run = Run.objects.get()
    expect(page).to_have_url(f"{live_server.url}/runs/{run.pk}/")
    expect(page.locator(".messages")).to_contain_text(f"Run {str(run.pk)[:8]} started.")
    assert run.objective_ref == "ticket-42" and run.budget_limits["max_attempts"] == 25


def test_a_reviewer_reads_their_own_decisions(live_server, page, login, acme, bob, carol):
    artifact = draft(acme)
    run = at_review(approvals_run(acme, bob), artifact)
    request = ask(run, artifact, bob)
    decide(request, carol, "reject", comment="Source 2 is not cited.")
    login(page, carol)
    page.get_by_role("link", name="My decisions").click()
    row = page.locator("#my-decisions tbody tr").first
    expect(row).to_contain_text("Reject")
    expect(row).to_contain_text("Source 2 is not cited.")
    expect(row).to_contain_text(request.artifact_sha256[:12])
    row.get_by_role("link", name="publish").click()
    expect(page).to_have_url(f"{live_server.url}/approvals/{request.pk}/")


def test_a_404_names_the_other_tenant_of_yours_the_run_is_in(
    live_server, page, login, alice, globex, charlie, acme
):
    workflow_register(
        tenant=globex, workflow_type="research", version="1", definition=SIMPLE_DEFINITION
    )
    theirs = plain_run(globex, charlie)
    login(page, alice)  # current tenant: acme
    response = page.goto(f"{live_server.url}/runs/{theirs.pk}/")
    assert response.status == 404
    # Alice is no member of globex yet: the 404 says nothing about where the run is.
    expect(page.locator("#other-tenant-hint")).to_have_count(0)
    member_set_role(tenant=globex, user=alice, role="operator", actor=Actor.system("test"))
    response = page.goto(f"{live_server.url}/runs/{theirs.pk}/")
    assert response.status == 404
    hint = page.locator("#other-tenant-hint")
    expect(hint).to_contain_text("belongs to the tenant")
    expect(hint).to_contain_text(globex.name or globex.slug)
    hint.get_by_role("button", name="Switch to").click()
    expect(page).to_have_url(f"{live_server.url}/runs/{theirs.pk}/")
    expect(page.get_by_role("heading", name=f"Run {theirs.pk}")).to_be_visible()
    page.console_errors.clear()  # the two 404s were the point
