"""Reasons and confirmations in a real browser: a run is put on legal hold from its page
with a reason, the hold list says who and why, a release and a policy removal ask first,
and a run is held by the 8 characters pages show."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from checkpoints.models import Run, RunStatus
from retention.models import RetentionPolicy
from retention.policies import PolicyInput, retention_policy_save
from tenants.models import AuditEvent
from tenants.services import Actor
from tests.retention_support import build

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_run_is_held_from_its_page_and_released_only_after_a_confirmation(
    live_server, page, login, alice, acme, bob, workflow
):
    run = build(acme, bob, status=RunStatus.SUCCEEDED).run
    login(page, alice)
    page.goto(f"{live_server.url}/runs/{run.pk}/")
    hold = page.locator("#run-legal-hold")
    hold.get_by_label("Reason").fill("subpoena 2026-114")
    hold.get_by_role("button", name="Put the run on legal hold").click()
    expect(page.locator(".messages")).to_contain_text(f"Run {str(run.pk)[:8]} is on legal hold.")
    held = page.locator("#held-runs")
    expect(held).to_contain_text(str(run.pk)[:8])
    expect(held).to_contain_text("held by alice")
    expect(held).to_contain_text("subpoena 2026-114")

    held.get_by_role("button", name="Release").click()
    confirm = page.locator("#confirm")
    expect(confirm).to_contain_text(f"Release run {str(run.pk)[:8]} from legal hold?")
    assert Run.objects.get(pk=run.pk).legal_hold  # nothing happened yet
    confirm.get_by_label("Reason for the release").fill("case closed")
    confirm.get_by_role("button", name="Release the hold").click()
    expect(page.locator(".messages")).to_contain_text("released from legal hold")
    assert not Run.objects.get(pk=run.pk).legal_hold
    off = AuditEvent.objects.get(action="retention.legal_hold_off")
    assert off.reason == "case closed" and off.actor == alice


def test_a_run_is_held_by_its_eight_character_prefix(
    live_server, page, login, alice, acme, bob, workflow
):
    run = build(acme, bob, status=RunStatus.SUCCEEDED).run
    login(page, alice)
    page.goto(f"{live_server.url}/retention/")
    page.get_by_label("Run id").fill(str(run.pk)[:8])
    page.locator("#run-hold-reason").fill("litigation")
    page.get_by_role("button", name="Put the run on legal hold").click()
    expect(page.locator(".messages")).to_contain_text("is on legal hold")
    assert Run.objects.get(pk=run.pk).legal_hold


def test_removing_a_policy_asks_first(live_server, page, login, alice, acme, workflow):
    retention_policy_save(
        tenant=acme,
        data=PolicyInput(workflow_type="research", intermediate_days=5),
        actor=Actor(user=alice),
    )
    login(page, alice)
    page.goto(f"{live_server.url}/retention/")
    page.locator("#policies").get_by_role("button", name="Remove").click()
    confirm = page.locator("#confirm")
    expect(confirm).to_contain_text("Remove the retention policy for research?")
    assert RetentionPolicy.objects.filter(workflow_type="research").exists()
    confirm.get_by_role("button", name="Remove the policy").click()
    expect(page.locator(".messages")).to_contain_text("Policy for research removed.")
    assert not RetentionPolicy.objects.exists()
