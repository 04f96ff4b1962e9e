"""Operator actions in a real browser: fork from an older checkpoint, retry a step, cancel,
and a refusal when the run changed after the page loaded. Each checks what the page shows."""

from __future__ import annotations

import json
import re

import pytest
from playwright.sync_api import expect

from checkpoints.models import Run
from tests.actions_support import advance, operation, worker_run


@pytest.fixture
def at_review(acme, bob) -> Run:  # noqa: ANN001
    run = worker_run(acme, bob, inputs={"question": "why?", "lang": "en"})
    return advance(advance(run, bob, "draft_answer"), bob, "review")


def open_run(page, live_server, run: Run) -> None:  # noqa: ANN001
    page.goto(f"{live_server.url}/runs/{run.pk}/")
    expect(page.get_by_role("heading", name="Actions")).to_be_visible()


def panel(page):  # noqa: ANN001, ANN201
    return page.locator("#run-actions")


def review_fork(page, *, sequence: str, reason: str, patch: str = ""):  # noqa: ANN001, ANN201
    """Fill the fork form and ask what will happen; returns the actions panel."""
    actions = panel(page)
    actions.get_by_role("button", name="Fork…").click()
    # Choosing a checkpoint reloads the form with its input values: wait for it.
    # htmx wires the select up once the form has settled; a change before that is lost.
    expect(actions.get_by_label("Inputs at the checkpoint")).to_be_visible()
    page.wait_for_function("!document.querySelector('.htmx-request, .htmx-settling')")
    with page.expect_response(lambda r: f"from_sequence={sequence}" in r.url):
        actions.get_by_label("From checkpoint").select_option(sequence)
    if patch:
        # The editor holds the checkpoint's input values: merge the change into them.
        editor = actions.get_by_label("Inputs at the checkpoint")
        values = {**json.loads(editor.input_value()), **json.loads(patch)}
        editor.fill(json.dumps(values))
    actions.get_by_label("Reason").fill(reason)
    actions.get_by_role("button", name="Review what will happen").click()
    return actions


def test_an_operator_forks_a_run_from_an_older_checkpoint(
    live_server,
    page,
    login,
    bob,
    at_review,
    screenshot,  # noqa: ANN001
):
    published = advance(at_review, bob, "publish")
    operation(published, "publish-1", "confirmed")
    login(page, bob)
    open_run(page, live_server, published)
    actions = review_fork(
        page, sequence="2", reason="try the German sources", patch='{"lang": "de"}'
    )

    # Before the fork is made, the page says which confirmed effect may happen again.
    warning = actions.get_by_role("alert")
    expect(warning).to_contain_text("publish-1")
    expect(warning).to_contain_text("may perform it again")
    expect(actions).to_contain_text("This run is not changed.")
    screenshot(page, "fork-confirmation")
    actions.get_by_role("button", name="Create the fork").click()

    page.wait_for_url(lambda url: str(published.pk) not in url)
    fork = Run.objects.exclude(pk=published.pk).get()
    expect(page).to_have_url(re.compile(rf"/runs/{fork.pk}/$"))
    parent = page.locator("#fork-parent")
    expect(parent).to_contain_text("Forked from run")
    expect(parent.get_by_role("link", name="#2")).to_be_visible()
    expect(page.get_by_role("status")).to_contain_text("may happen again: publish-1")
    expect(page.locator('[data-field="state"]')).to_have_text("draft_answer")
    expect(page.locator("#audit")).to_contain_text("try the German sources")
    # The source run is listed with its fork and is otherwise unchanged.
    open_run(page, live_server, published)
    expect(page.locator("#forks")).to_contain_text(str(fork.pk)[:8])
    expect(page.locator('[data-field="state"]')).to_have_text("publish")


def test_an_operator_retries_a_named_step(live_server, page, login, bob, at_review):  # noqa: ANN001
    login(page, bob)
    open_run(page, live_server, at_review)
    actions = panel(page)
    actions.get_by_role("button", name="Retry a step…").click()
    actions.get_by_label("Step to run again").select_option("draft")
    actions.get_by_label("Reason").fill("the draft cites a retracted paper")
    actions.get_by_role("button", name="Review what will happen").click()
    expect(actions).to_contain_text("Checkpoint #4 is appended")
    actions.get_by_role("button", name="Run the step again").click()

    expect(page.get_by_role("status")).to_contain_text("Step draft will run again")
    expect(page.locator('[data-field="state"]')).to_have_text("draft_answer")
    expect(page.locator('[data-field="status"]')).to_have_text("Running")
    newest = page.locator("#timeline tbody tr").first
    expect(newest).to_contain_text("draft_answer")
    expect(newest).to_contain_text("bob")
    expect(page.locator("#audit")).to_contain_text("the draft cites a retracted paper")


def test_an_operator_cancels_a_run(live_server, page, login, bob, at_review, screenshot):  # noqa: ANN001
    login(page, bob)
    open_run(page, live_server, at_review)
    actions = panel(page)
    actions.get_by_role("button", name="Cancel…").click()
    actions.get_by_label("Reason").fill("the customer withdrew the question")
    actions.get_by_role("button", name="Review what will happen").click()
    expect(actions).to_contain_text("becomes cancelled")
    actions.get_by_role("button", name="Cancel the run").click()

    expect(page.get_by_role("status")).to_contain_text("Cancelled.")
    expect(page.locator('[data-field="status"]')).to_have_text("Cancelled")
    expect(panel(page).get_by_role("button", name="Cancel…")).to_have_count(0)
    expect(panel(page).get_by_role("button", name="Fork…")).to_be_visible()
    expect(page.locator("#audit")).to_contain_text("the customer withdrew the question")
    screenshot(page, "run-cancelled")


def test_an_action_on_a_run_that_changed_after_the_page_loaded_is_refused(
    live_server,
    page,
    login,
    bob,
    at_review,  # noqa: ANN001
):
    login(page, bob)
    open_run(page, live_server, at_review)
    actions = panel(page)
    actions.get_by_role("button", name="Cancel…").click()
    actions.get_by_label("Reason").fill("stop")
    # Meanwhile someone else moves the run on.
    advance(at_review, bob, "review", status="paused_for_review")
    actions.get_by_role("button", name="Review what will happen").click()
    alert = actions.get_by_role("alert")
    expect(alert).to_contain_text("changed since you loaded the page")
    expect(alert).to_contain_text("Nothing was done")
    alert.get_by_role("link", name="Reload the run").click()
    expect(page.locator('[data-field="status"]')).to_have_text("Paused For Review")
    at_review.refresh_from_db()
    assert at_review.status == "paused_for_review"


def test_a_double_click_on_create_the_fork_makes_one_fork(live_server, page, login, bob, at_review):  # noqa: ANN001, E501
    login(page, bob)
    open_run(page, live_server, at_review)
    actions = review_fork(page, sequence="2", reason="try again from the draft")
    actions.get_by_role("button", name="Create the fork").dblclick()
    page.wait_for_url(lambda url: str(at_review.pk) not in url)
    expect(page.locator("#fork-parent")).to_contain_text("Forked from run")
    assert Run.objects.filter(forked_from_run=at_review).count() == 1
