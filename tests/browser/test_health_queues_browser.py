"""The Health page's queues, workers and waiting retries in Chromium (issue 29, item 6)."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.utils import timezone
from playwright.sync_api import expect

from checkpoints.models import Run, RunStatus, WorkerHeartbeat
from runtime.registry import workflow_ensure_registered
from tests.runtime_support import start

pytestmark = pytest.mark.django_db(transaction=True)


def test_an_operator_sees_queues_live_and_dead_workers_and_retries(
    live_server, page, login, screenshot, bob, acme, settings
):
    settings.CAIRN_DISPATCH_ON_COMMIT = False
    assert workflow_ensure_registered("research", "1")
    queued = start(acme, "research", question="still queued")
    retrying = start(acme, "research", question="q", budget={"max_attempts": 5})
    Run.objects.filter(pk=retrying.pk).update(
        status=RunStatus.WAITING_RETRY,
        next_eligible_at=timezone.now() + timedelta(minutes=10),
        budget_used={"attempts_used": 3},
        status_reason="extract_claims failed: TimeoutError: the model did not answer",
    )
    now = timezone.now()
    WorkerHeartbeat.objects.create(worker_id="w-live", last_seen_at=now)
    for index in range(4):
        WorkerHeartbeat.objects.create(
            worker_id=f"w-dead{index}", last_seen_at=now - timedelta(minutes=10)
        )
    login(page, bob)
    page.get_by_role("navigation", name="Main").get_by_role("link", name="Health").click()
    expect(page.locator("#workers-recent")).to_have_text("1")
    expect(page.locator("#workers-dead")).to_have_text("4")
    backlog = page.locator("#queue-backlog tbody tr").first
    expect(backlog.locator("[data-outbox-due]")).to_have_text("2")  # both runs' first command
    # The broker answers with a count (the in-process memory broker is shared by the tests).
    expect(backlog.locator("[data-waiting]")).to_have_text(re.compile(r"^\d+$"))
    row = page.locator(f'#retrying-runs tr[data-run-id="{retrying.pk}"]')
    expect(row).to_contain_text("3 / 5")
    expect(row).to_contain_text("TimeoutError: the model did not answer")
    expect(row).to_contain_text("(in 9")
    row.get_by_role("link").click()
    expect(page).to_have_url(f"{live_server.url}/runs/{retrying.pk}/")
    screenshot(page, "health-queues")
    assert queued.pk != retrying.pk


def test_the_health_page_refreshes_while_it_is_open_and_keeps_a_typed_threshold(
    live_server, page, login, bob, acme, settings
):
    settings.CAIRN_DISPATCH_ON_COMMIT = False
    settings.CAIRN_CONSOLE_REFRESH_SECONDS = 1
    assert workflow_ensure_registered("research", "1")
    login(page, bob)
    page.goto(f"{live_server.url}/health/")
    running = page.locator('#health-status td[data-status="running"]')
    expect(running).to_have_text("0")
    page.locator("#restored-threshold").fill("7")
    start(acme, "research", question="arrives while the page is open")
    # The next poll brings the new count, and leaves the field as typed.
    expect(running).to_have_text("1")
    expect(page.locator("#restored-threshold")).to_have_value("7")
