"""The runs list stays live in a real browser: a run created while the page is open
appears at the top, status chips and badges follow a run's new status, and a filter the
server cannot read is named while the grid of filters keeps its shape."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from runtime.services.cancel import run_cancel
from tenants.services import Actor
from tests.console_data import plain_run

pytestmark = pytest.mark.django_db(transaction=True)


def chip(page, status: str):  # noqa: ANN001, ANN201
    return page.locator(f'#status-counts a[data-status="{status}"] .count')


def test_new_runs_appear_and_status_chips_refresh(
    live_server, page, login, settings, bob, acme, workflow
):
    settings.CAIRN_CONSOLE_REFRESH_SECONDS = 1
    first = plain_run(acme, bob, objective="first")
    login(page, bob)
    page.goto(f"{live_server.url}/runs/")
    expect(chip(page, "running")).to_have_text("1")
    expect(page.locator("#run-rows tr")).to_have_count(1)

    second = plain_run(acme, bob, objective="arrived later")
    newest = page.locator("#run-rows tr").first
    expect(newest).to_have_attribute("data-run-id", str(second.pk))
    expect(newest).to_contain_text("arrived later")
    expect(chip(page, "running")).to_have_text("2")

    run_cancel(tenant=acme, run_id=first.pk, reason="not needed", actor=Actor(user=bob))
    expect(chip(page, "cancelled")).to_have_text("1")
    expect(chip(page, "running")).to_have_text("1")
    expect(page.locator(f"#run-{first.pk} .badge")).to_have_text("Cancelled")


def test_a_filter_error_is_named_and_the_filter_grid_keeps_its_rows(
    live_server, page, login, bob, acme, workflow
):
    run = plain_run(acme, bob, objective="still listed")
    login(page, bob)
    page.goto(f"{live_server.url}/runs/?restored_more_than=-3&state=x")
    expect(page.locator("#filters-left-out")).to_contain_text("Restored more than")
    # The other filter applies; the wrong one is left out. With state=x nothing matches.
    expect(page.locator("#run-rows")).to_contain_text("No runs match")
    page.goto(f"{live_server.url}/runs/?restored_more_than=-3")
    expect(page.locator(f"#run-{run.pk}")).to_be_visible()
    # Inputs that share a row of the grid with the erroneous one stay level with it.
    wrong = page.locator(".filters .field", has=page.locator("#id_restored_more_than"))
    box = wrong.bounding_box()
    level = round(page.locator("#id_restored_more_than").bounding_box()["y"])
    neighbours = []
    for field in page.locator(".filters .field:not(.check)").all():
        other = field.bounding_box()
        if other["y"] < box["y"] + box["height"] and box["y"] < other["y"] + other["height"]:
            neighbours.append(round(field.locator("input, select").first.bounding_box()["y"]))
    assert len(neighbours) > 1 and set(neighbours) == {level}, (level, neighbours)
