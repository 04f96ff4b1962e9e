"""A bulk cancel in Chromium (issue 29, item 3): 200 runs selected by the runs list's filter
(five of them already cancelled), the dry run's count and refusal reason, the confirmation,
the progress bar a real worker moves to 200, and the summary with the refusals."""

from __future__ import annotations

import time

import pytest
from playwright.sync_api import expect

from checkpoints.models import BulkAction, Run, RunStatus
from runtime.services.cancel import run_cancel
from runtime.services.runs import run_create
from tenants.models import AuditEvent
from tenants.services import Actor

pytestmark = [pytest.mark.worker, pytest.mark.django_db(transaction=True)]

REFUSED = "The run is already cancelled; there is nothing to cancel."


def test_a_bulk_cancel_of_200_runs_selected_by_the_lists_filter(
    live_server, page, login, screenshot, acme, bob, workflow, worker_factory, settings
):
    settings.CAIRN_CONSOLE_REFRESH_SECONDS = 1
    worker_factory("w1")
    actor = Actor(user=bob)
    began = time.monotonic()
    batch = [
        run_create(
            tenant=acme,
            workflow_type="research",
            inputs={"question": f"q{i}"},
            objective_ref=f"batch-7 item {i}",
            execution="external",
            actor=actor,
        )
        for i in range(200)
    ]
    others = [
        run_create(
            tenant=acme,
            workflow_type="research",
            inputs={"question": "keep"},
            objective_ref="another batch",
            execution="external",
            actor=actor,
        )
        for _ in range(3)
    ]
    for run in batch[:5]:
        run_cancel(tenant=acme, run_id=run.pk, reason="earlier", actor=actor)
    created_in = time.monotonic() - began
    assert created_in < 120, f"creating the runs took {created_in:.1f} s"

    login(page, bob)
    page.goto(f"{live_server.url}/runs/?q=batch-7")
    page.get_by_role("link", name="Act on every run matching these filters…").click()
    expect(page.locator("[data-selected-count]")).to_have_text("200")
    expect(page.locator("#bulk-selection")).to_contain_text("batch-7")
    page.get_by_label("Action").select_option("cancel")
    page.get_by_label("Reason").fill("incident 42: stop the batch")
    page.get_by_role("button", name="Review what will happen").click()

    expect(page.locator("[data-actionable]")).to_have_text("195")
    expect(page.locator("[data-refused]")).to_have_text("5")
    expect(page.locator("#bulk-plan-refusals")).to_contain_text(REFUSED)
    assert not BulkAction.objects.exists()  # the dry run changed nothing
    screenshot(page, "bulk-dry-run")
    page.get_by_role("button", name="Cancel 195 runs").click()

    bar = page.locator("#bulk-bar")
    expect(bar).to_have_attribute("max", "200")
    expect(bar).to_have_attribute("value", "200", timeout=120_000)
    summary = page.locator("#bulk-summary")
    expect(summary).to_contain_text("Cancel: 195 of 200 runs done, 5 refused.")
    expect(summary.locator("tbody tr")).to_have_count(5)
    expect(summary).to_contain_text(REFUSED)
    screenshot(page, "bulk-summary")

    bulk = BulkAction.objects.get()
    assert (bulk.status, bulk.done, bulk.refused) == ("finished", 195, 5)
    assert bulk.selection == {"filter": {"q": "batch-7"}}
    assert (
        Run.objects.filter(pk__in=[r.pk for r in batch], status=RunStatus.CANCELLED).count() == 200
    )
    assert not Run.objects.filter(pk__in=[r.pk for r in others]).exclude(status="running").exists()
    cancels = AuditEvent.objects.filter(action="run.cancel", reason="incident 42: stop the batch")
    assert cancels.count() == 195
    assert AuditEvent.objects.filter(action="runs.bulk_action").count() == 1


def test_ticked_runs_stay_ticked_through_the_rows_refresh_and_are_the_selection(
    live_server, page, login, acme, bob, workflow, settings
):
    settings.CAIRN_CONSOLE_REFRESH_SECONDS = 1
    actor = Actor(user=bob)

    def new_run(name: str) -> Run:
        return run_create(
            tenant=acme,
            workflow_type="research",
            inputs={"question": name},
            objective_ref=name,
            execution="external",
            actor=actor,
        )

    first, second, _ = (new_run(f"run {i}") for i in range(3))
    login(page, bob)
    page.goto(f"{live_server.url}/runs/")
    page.get_by_label(f"Tick run {str(first.pk)[:8]}").check()
    page.get_by_label(f"Tick run {str(second.pk)[:8]}").check()
    # A new run joins the rows at the top: the rows are swapped, the ticks stay.
    fresh = new_run("a newcomer")
    expect(page.locator(f"#run-{fresh.pk}")).to_be_visible()
    expect(page.get_by_label(f"Tick run {str(first.pk)[:8]}")).to_be_checked()
    expect(page.get_by_label(f"Tick run {str(second.pk)[:8]}")).to_be_checked()

    page.get_by_role("button", name="Act on the ticked runs…").click()
    expect(page.locator("[data-selected-count]")).to_have_text("2")
    expect(page.locator("#bulk-selection")).to_contain_text("the runs you ticked")
    page.get_by_label("Action").select_option("pause")
    # The reason is required: the browser asks for it before anything is sent.
    reason = page.get_by_label("Reason")
    expect(reason).to_have_attribute("required", "")
    reason.fill("look at these two")
    page.get_by_role("button", name="Review what will happen").click()
    expect(page.locator("[data-actionable]")).to_have_text("2")
    expect(page.get_by_role("button", name="Pause 2 runs")).to_be_visible()
