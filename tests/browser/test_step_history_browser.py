"""Step history in a real browser: the run page lists each attempt with its duration, a
failed attempt's exception type opens its traceback, and a model call's prompt opens as
the text the step sent; the table fits a narrow screen."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from runtime import Workflow
from tests.runtime_support import advance, start

trips = {"left": 0}

stumbling_browser = Workflow("stumbling_browser", version="1")


@stumbling_browser.step("ask", next="done")
def ask(ctx):  # noqa: ANN001, ANN201
    ctx.model.complete(prompt="Which stones make a cairn?")
    if trips["left"]:
        trips["left"] -= 1
        raise LookupError("the map has no such valley")
    return {"asked": True}


stumbling_browser.terminal("done")


@pytest.mark.parametrize("width", [1280, 390])
def test_the_run_page_shows_each_attempt_its_traceback_and_its_prompt(
    live_server,
    page,
    login,
    bob,
    acme,
    settings,
    width,  # noqa: ANN001
):
    settings.CAIRN_RETRY_DELAY_SECONDS = 0
    trips["left"] = 1
    run = start(acme, "stumbling_browser", budget={"max_attempts": 3, "max_tokens": 100000})
    assert advance(run, owner="worker-a") == "waiting_retry"
    assert advance(run, owner="worker-b") == "succeeded"
    page.set_viewport_size({"width": width, "height": 900})
    login(page, bob)
    page.goto(f"{live_server.url}/runs/{run.pk}/")
    attempts = page.locator("#timeline td.attempt")
    expect(attempts.filter(has_text="ask #1")).to_contain_text("retry")
    expect(attempts.filter(has_text="ask #1")).to_contain_text("LookupError")
    expect(attempts.filter(has_text="ask #2")).to_contain_text("committed")
    expect(page.locator("#timeline")).to_contain_text(" ms")
    assert (
        page.evaluate("document.documentElement.scrollWidth - document.documentElement.clientWidth")
        == 0
    )
    failed = page.locator("#timeline tr.attempt-failed")
    expect(failed).to_have_count(1)
    expect(failed).to_contain_text("worker worker-a")
    failed.get_by_role("link", name="traceback of attempt 1").click()
    expect(page.locator("body")).to_contain_text("LookupError: the map has no such valley")
    expect(page.locator("body")).to_contain_text("Traceback (most recent call last)")
    page.go_back()
    committed = page.locator("#timeline tr", has_text="ask #2")
    committed.get_by_role("link", name="prompt of call 1").click()
    expect(page.locator("body")).to_contain_text("Which stones make a cairn?")
