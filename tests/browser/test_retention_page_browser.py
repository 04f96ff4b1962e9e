"""The retention page in a real browser: choosing a scope loads that scope's policy, and a run
id of spaces (which ``required`` lets through) is refused by the server, never a tenant hold."""

from __future__ import annotations

import re

from playwright.sync_api import expect

from checkpoints.services.workflows import workflow_register
from retention.models import RetentionPolicy
from retention.policies import PolicyInput, retention_policy_save
from tenants.models import AuditEvent, Tenant
from tenants.services import Actor
from tests.factories import SIMPLE_DEFINITION


def test_choosing_another_scope_shows_its_values_and_saves_only_them(
    live_server,
    page,
    login,
    alice,
    acme,
):  # noqa: ANN001
    workflow_register(tenant=acme, workflow_type="ext", version="1", definition=SIMPLE_DEFINITION)
    for workflow_type, days in (("", 30), ("ext", 7)):
        retention_policy_save(
            tenant=acme,
            data=PolicyInput(workflow_type=workflow_type, intermediate_days=days),
            actor=Actor.system("test"),
        )
    login(page, alice)
    page.goto(f"{live_server.url}/retention/?workflow_type=ext")
    heading = page.locator("#h-policy")
    keep = page.get_by_label("Keep intermediate checkpoints of finished runs (days)")
    expect(heading).to_contain_text("workflow ext")
    expect(keep).to_have_value("7")

    page.get_by_label("Applies to").focus()
    page.get_by_label("Applies to").select_option("")
    expect(heading).to_have_text("Policy for all workflows (default)")
    expect(keep).to_have_value("30")
    expect(page).to_have_url(re.compile(r"/retention/\?workflow_type=$"))
    expect(page.get_by_label("Applies to")).to_be_focused()  # a keyboard user stays put

    keep.fill("20")
    page.get_by_role("button", name="Save the policy for all workflows").click()
    expect(page.locator(".messages")).to_contain_text("Retention policy for the default saved.")
    saved = dict(RetentionPolicy.objects.values_list("workflow_type", "intermediate_days"))
    assert saved == {"": 20, "ext": 7}


def test_a_run_id_of_spaces_is_refused_and_the_tenant_stays_unheld(
    live_server,
    page,
    login,
    alice,
    acme,
):  # noqa: ANN001
    login(page, alice)
    page.goto(f"{live_server.url}/retention/")
    page.get_by_label("Run id").fill("   ")
    page.locator("#run-hold-reason").fill("litigation")
    # The browser's own check (minlength, pattern) stops it first…
    assert not page.get_by_label("Run id").evaluate("e => e.checkValidity()")
    # …and the server refuses it as well when that check is bypassed.
    page.locator("#run-hold-form").evaluate("form => { form.noValidate = true; }")
    page.get_by_role("button", name="Put the run on legal hold").click()
    expect(page.locator("#err-run-hold-id")).to_have_text("Enter a run id.")
    expect(page.locator("#tenant-hold-state")).to_contain_text("Not on hold")
    assert not Tenant.objects.get(pk=acme.pk).legal_hold
    assert not AuditEvent.objects.filter(action__startswith="retention.legal_hold").exists()
    # The browser logs the 422 itself; it is what this test provoked.
    assert all("422" in error for error in page.console_errors), page.console_errors
    page.console_errors.clear()
