"""The console in a real browser: sign in, filter the runs, open a run, read its evidence."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import expect

from checkpoints.models import Run
from tests.console_data import plain_run, story_run


@pytest.fixture
def runs(acme, bob, workflow) -> dict[str, Run]:  # noqa: ANN001
    return {
        "waiting": story_run(acme, bob, objective="INV-7 needs review"),
        "running": plain_run(acme, bob, objective="INV-8 collecting"),
        "other": plain_run(acme, bob, objective="INV-9 collecting"),
    }


def test_an_operator_signs_in_and_sees_the_menu_of_the_role(live_server, page, login, bob):  # noqa: ANN001
    login(page, bob)
    nav = page.get_by_role("navigation", name="Main")
    expect(nav.get_by_role("link", name="Runs")).to_be_visible()
    expect(nav.get_by_role("link", name="Health")).to_be_visible()  # on call, an operator
    expect(nav.get_by_role("link", name="Members")).to_have_count(0)
    expect(nav.get_by_role("link", name="Approvals")).to_have_count(0)


def test_an_operator_filters_the_runs_and_the_filter_stays_in_the_url(
    live_server,
    page,
    login,
    bob,
    runs,
    screenshot,  # noqa: ANN001
):
    login(page, bob)
    expect(page).to_have_url(re.compile(r"/runs/$"))
    table = page.locator("#run-rows")
    expect(table.locator("tr")).to_have_count(3)
    # The counts per status arrive in their own request after the rows.
    counts = page.get_by_role("navigation", name="Runs by status")
    expect(counts.locator('[data-status="running"] .count')).to_have_text("2")
    expect(counts.locator('[data-status="waiting_approval"] .count')).to_have_text("1")
    screenshot(page, "runs-list")

    page.get_by_label("Status", exact=True).select_option("waiting_approval")
    page.get_by_role("button", name="Apply filters").click()
    expect(page).to_have_url(re.compile(r"status=waiting_approval"))
    expect(table.locator("tr")).to_have_count(1)
    expect(table).to_contain_text("INV-7 needs review")
    expect(table).to_contain_text("stalled operation")

    page.get_by_label("Search run id or objective").fill("INV-8")
    page.get_by_label("Status", exact=True).select_option("")
    page.get_by_role("button", name="Apply filters").click()
    expect(table.locator("tr")).to_have_count(1)
    expect(table).to_contain_text("INV-8 collecting")

    # The URL is the bookmark: opening it again gives the same view.
    bookmarked = page.url
    page.goto(live_server.url + "/runs/")
    page.goto(bookmarked)
    expect(page.get_by_label("Search run id or objective")).to_have_value("INV-8")
    expect(table.locator("tr")).to_have_count(1)


def test_the_visible_rows_refresh_without_reloading_the_page(
    live_server,
    page,
    login,
    bob,
    runs,  # noqa: ANN001
):
    login(page, bob)
    row = page.locator(f"#run-{runs['running'].pk}")
    expect(row).to_contain_text("Running")
    page.evaluate("window.__marker = 'same page'")
    Run.objects.filter(pk=runs["running"].pk).update(status="failed")
    expect(row).to_contain_text("Failed", timeout=15_000)
    assert page.evaluate("window.__marker") == "same page"


def test_an_operator_opens_a_run_and_reads_what_is_proven(
    live_server,
    page,
    login,
    bob,
    runs,
    screenshot,  # noqa: ANN001
):
    waiting = runs["waiting"]
    login(page, bob)
    page.get_by_role("link", name=str(waiting.pk)[:8]).click()
    expect(page.get_by_role("heading", level=1)).to_contain_text(str(waiting.pk))

    snapshot = page.locator("#run-snapshot")
    expect(snapshot.locator('[data-field="state"]')).to_have_text("review")
    expect(snapshot.locator('[data-field="version"]')).to_have_text("3")
    expect(snapshot).to_contain_text("2 of 5 used · 3 left")

    current = page.locator('svg g.current[data-state="review"]')
    expect(current).to_have_count(1)
    expect(page.locator("svg path.edge.taken")).to_have_count(2)
    expect(page.locator("#timeline tbody tr")).to_have_count(3)

    operations = page.locator("#operations")
    expect(operations).to_contain_text(f"publish-{waiting.pk}")
    expect(operations).to_contain_text("prov-123")

    # The viewer swaps in below the table (htmx) and shows the draft as text, not markup.
    page.get_by_role("link", name=re.compile(r"View")).first.click()
    viewer = page.locator("#artifact-viewer pre")
    expect(viewer).to_contain_text("<script>alert('draft')</script>")
    expect(viewer).to_contain_text("The answer is 42.")
    assert page.url.endswith(f"/runs/{waiting.pk}/")
    screenshot(page, "run-detail")

    page.get_by_role("link", name="3", exact=True).click()
    expect(page.get_by_role("heading", level=1)).to_have_text("Checkpoint #3")
    expect(page.locator("#verification")).to_contain_text("Verified: 3 checkpoints")
    expect(page.locator("#group-position [data-change='changed']")).to_have_count(2)


def test_the_console_is_usable_on_a_narrow_screen(
    live_server,
    page,
    login,
    bob,
    runs,
    screenshot,  # noqa: ANN001
):
    page.set_viewport_size({"width": 390, "height": 844})
    login(page, bob)
    expect(
        page.get_by_role("navigation", name="Main").get_by_role("link", name="Runs")
    ).to_be_visible()
    # The filters start folded, so the status chips and the rows come first.
    expect(page.get_by_role("button", name="Apply filters")).to_be_hidden()
    expect(page.locator("table.runs th", has_text="Status")).to_be_in_viewport()
    page.locator("#run-filters > summary").click()
    expect(page.get_by_role("button", name="Apply filters")).to_be_visible()
    # Nothing but the table scroller may be wider than the screen.
    overflow = page.evaluate("document.documentElement.scrollWidth - window.innerWidth")
    assert overflow <= 0
    screenshot(page, "runs-list-narrow")


def test_keyboard_focus_starts_at_the_skip_link(live_server, page, login, bob, runs):  # noqa: ANN001
    login(page, bob)
    page.keyboard.press("Tab")
    focused = page.evaluate("document.activeElement.textContent")
    assert focused == "Skip to content"
