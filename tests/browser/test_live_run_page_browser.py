"""The live run page in Chromium (issue 29, item 2, in part): an idle page's polls come
back 304 without a body, a run that moves on withdraws the page's actions (Cancel is not
left on a failed run), a finished run's page stops polling, and Resume is never offered on a
run whose budget is spent. Prints what an idle page costs per minute (docs/console.md)."""

from __future__ import annotations

import time

from playwright.sync_api import expect

from checkpoints.models import Run
from runtime.services.cancel import run_cancel
from tenants.services import Actor
from tests.actions_support import advance, worker_run


def polls(page) -> list:  # noqa: ANN001
    seen: list = []
    page.on("requestfinished", lambda r: seen.append(r) if "/snapshot/" in r.url else None)
    return seen


def cost(requests: list, seconds: float) -> tuple[float, float, list[int]]:
    """Requests and response bytes (headers and body on the wire) per minute."""
    sizes = [r.sizes() for r in requests]
    wire = sum(s["responseHeadersSize"] + s["responseBodySize"] for s in sizes)
    statuses = [r.response().status for r in requests]
    return len(requests) * 60 / seconds, wire * 60 / seconds, statuses


def test_an_idle_page_costs_304s_and_a_moved_run_updates_every_card(
    live_server, page, login, acme, bob, settings
):
    settings.CAIRN_CONSOLE_REFRESH_SECONDS = 1
    run = worker_run(acme, bob)
    login(page, bob)
    seen = polls(page)
    page.goto(f"{live_server.url}/runs/{run.pk}/")
    actions = page.locator("#run-actions")
    expect(actions.locator('[data-action="cancel"]')).to_be_visible()
    start = time.monotonic()
    page.wait_for_timeout(6000)
    per_minute, bytes_per_minute, statuses = cost(list(seen), time.monotonic() - start)
    first = seen[0].sizes()
    print(
        f"\nidle run page: {per_minute:.0f} polls/min, {bytes_per_minute:.0f} bytes/min "
        f"(statuses {statuses}); a full snapshot is {first['responseBodySize']} bytes of body"
    )
    print("first poll", seen[0].sizes(), "then", seen[-1].sizes())
    # After the first poll nothing changed: each poll revalidates the browser's copy and the
    # server answers 304 without a body (Chromium hands htmx its cached copy, as a 200).
    assert len(seen) >= 4
    assert first["responseBodySize"] > 0
    etag = seen[0].response().all_headers()["etag"]
    for request in seen[1:]:
        assert request.all_headers().get("if-none-match") == etag
        assert request.sizes()["responseBodySize"] == 0
    expect(page.locator('[data-field="status"]')).to_have_text("Running")

    failed = advance(run, bob, "draft_answer", status="failed")
    # The next poll shows the failure and brings every card up to date, without a reload:
    # Cancel is gone, Resume is offered, the timeline has the failed checkpoint.
    expect(page.locator('[data-field="status"]')).to_have_text("Failed")
    expect(actions.locator('[data-action="resume"]')).to_be_visible()
    expect(actions.locator('[data-action="cancel"]')).to_have_count(0)
    expect(
        page.locator(f'#timeline tr[data-sequence="{failed.checkpoint_sequence}"]')
    ).to_be_visible()
    expect(page.locator("[data-snapshot-moved]")).to_contain_text("moved on from version")


def test_a_finished_runs_page_stops_polling(live_server, page, login, acme, bob, settings):
    settings.CAIRN_CONSOLE_REFRESH_SECONDS = 1
    run = worker_run(acme, bob)
    login(page, bob)
    seen = polls(page)
    page.goto(f"{live_server.url}/runs/{run.pk}/")
    expect(page.locator("#run-snapshot")).to_have_attribute("data-polling", "on")
    run_cancel(tenant=acme, run_id=run.pk, reason="done with it", actor=Actor(user=bob))
    snapshot = page.locator("#run-snapshot")
    expect(snapshot).to_have_attribute("data-polling", "off")
    expect(page.locator('[data-field="status"]')).to_have_text("Cancelled")
    count = len(seen)
    page.wait_for_timeout(3500)
    assert len(seen) == count, "a finished run's page polled again"
    page.reload()
    seen.clear()
    page.wait_for_timeout(2500)
    assert seen == []
    assert Run.objects.get(pk=run.pk).status == "cancelled"


def test_resume_is_not_offered_on_a_run_whose_budget_is_spent(live_server, page, login, acme, bob):
    run = worker_run(acme, bob, budget={"max_tokens": 10})
    run = advance(
        run, bob, "draft_answer", envelope={"budgets": {"tokens_used": 10}}, status="failed"
    )
    login(page, bob)
    page.goto(f"{live_server.url}/runs/{run.pk}/")
    actions = page.locator("#run-actions")
    expect(actions.locator('[data-action="grant_budget"]')).to_be_visible()
    expect(actions.locator('[data-action="resume"]')).to_have_count(0)
    expect(actions.locator('[data-action="retry"]')).to_have_count(0)
    expect(actions.locator('[data-action="cancel"]')).to_have_count(0)
