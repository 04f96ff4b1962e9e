"""The fork editor in Chromium (issue 29, item 5): the form starts from the chosen
checkpoint's input values, choosing another checkpoint reloads them, the confirmation shows
each change before → after, and an unchanged form says so in a sentence."""

from __future__ import annotations

import json

import pytest
from playwright.sync_api import expect

from checkpoints.models import Checkpoint, Run
from checkpoints.services.reads import checkpoint_envelope
from tests.actions_support import advance, worker_run


@pytest.fixture
def at_review(acme, bob) -> Run:  # noqa: ANN001
    run = worker_run(acme, bob, inputs={"question": "why?", "lang": "en"})
    return advance(advance(run, bob, "draft_answer"), bob, "review")


def open_fork_form(page, live_server, run: Run):  # noqa: ANN001, ANN201
    page.goto(f"{live_server.url}/runs/{run.pk}/")
    actions = page.locator("#run-actions")
    actions.get_by_role("button", name="Fork…").click()
    return actions


def choose_checkpoint(page, actions, sequence: str) -> None:  # noqa: ANN001
    """Choose the checkpoint and wait for the form to come back with its values."""
    # htmx wires the select up once the form has settled; a change before that is lost.
    expect(actions.get_by_label("Inputs at the checkpoint")).to_be_visible()
    page.wait_for_function("!document.querySelector('.htmx-request, .htmx-settling')")
    with page.expect_response(lambda r: f"from_sequence={sequence}" in r.url):
        actions.get_by_label("From checkpoint").select_option(sequence)
    # The response is in; its swap may not be yet (an edit made before it would be
    # replaced by the chosen checkpoint's values): wait until htmx is done with it.
    busy = page.locator(".htmx-request, .htmx-swapping, .htmx-settling, .htmx-added")
    expect(busy).to_have_count(0)


def test_an_operator_edits_the_inputs_and_sees_each_change_before_the_fork(
    live_server,
    page,
    login,
    bob,
    at_review,  # noqa: ANN001
):
    login(page, bob)
    actions = open_fork_form(page, live_server, at_review)
    editor = actions.get_by_label("Inputs at the checkpoint")
    choose_checkpoint(page, actions, "1")
    # The editor holds the values the steps read, not the envelope's inputs group.
    expect(editor).to_have_value(json.dumps({"lang": "en", "question": "why?"}, indent=2))
    editor.fill(json.dumps({"question": "why?", "lang": "de", "tone": "dry"}))
    actions.get_by_label("Reason").fill("German, drier")
    actions.get_by_role("button", name="Review what will happen").click()

    changes = actions.locator("table.fork-changes")
    expect(changes.locator('[data-change="lang"]')).to_contain_text('"en" → "de"')
    expect(changes.locator('[data-change="tone"]')).to_contain_text('(none) → "dry"')
    expect(changes.locator("[data-change]")).to_have_count(2)
    actions.get_by_role("button", name="Create the fork").click()

    page.wait_for_url(lambda url: str(at_review.pk) not in url)
    fork = Run.objects.get(forked_from_run=at_review)
    values = checkpoint_envelope(Checkpoint.objects.get(run=fork))["inputs"]["values"]
    assert values == {"question": "why?", "lang": "de", "tone": "dry"}


def test_an_unchanged_editor_says_the_fork_has_the_same_inputs(
    live_server,
    page,
    login,
    bob,
    at_review,  # noqa: ANN001
):
    login(page, bob)
    actions = open_fork_form(page, live_server, at_review)
    choose_checkpoint(page, actions, "2")
    expect(actions.get_by_label("Inputs at the checkpoint")).to_contain_text('"lang": "en"')
    actions.get_by_label("Reason").fill("same again")
    actions.get_by_role("button", name="Review what will happen").click()
    expect(actions).to_contain_text(
        "No input changes: the fork starts with the same inputs as checkpoint #2"
    )
    expect(actions.locator("table.fork-changes")).to_have_count(0)
