"""An operator on call in a real browser: Health and the audit log are in the menu and
open, and the run page says when its audit trail stops at 100 rows and links on."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from tenants.services import Actor, audit_record
from tests.console_data import story_run

pytestmark = pytest.mark.django_db(transaction=True)


def test_an_operator_sees_health_and_follows_the_audit_trail_to_the_log(
    live_server, page, login, bob, acme, workflow
):
    run = story_run(acme, bob)  # its publish operation is stalled
    for index in range(105):
        audit_record(
            tenant=acme,
            actor=Actor.system("test worker"),
            action="run.note",
            run_id=run.pk,
            target=f"note {index}",
        )
    login(page, bob)
    menu = page.get_by_role("navigation", name="Main")
    menu.get_by_role("link", name="Health").click()
    expect(page.locator("#stalled-count")).to_have_text("1")
    expect(page.get_by_text(f"publish-{run.pk}")).to_be_visible()

    page.goto(f"{live_server.url}/runs/{run.pk}/")
    expect(page.locator("#audit tbody tr")).to_have_count(100)
    # The run page pages on to the older events itself.
    page.locator("#audit-pages").get_by_role("link", name="Older events →").click()
    expect(page.locator("#audit")).to_contain_text("note 0")
    page.locator("#audit-all").get_by_role("link", name="This run in the audit log").click()
    expect(page.get_by_role("heading", name="Audit log")).to_be_visible()
    expect(page.get_by_label("Run id")).to_have_value(str(run.pk))
    expect(page.locator("body")).to_contain_text("note 104")
    # Page on to events older than the 100 the run page shows.
    for _ in range(2):
        page.get_by_role("link", name="Older →").click()
    expect(page.locator("body")).to_contain_text("note 0")
    menu = page.get_by_role("navigation", name="Main")
    expect(menu.get_by_role("link", name="Audit log")).to_be_visible()
