"""In a real browser, the console works under its Content-Security-Policy: htmx swaps with
the CSRF header and no violation is reported, while an inline script is refused."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import expect

from tenants import roles
from tenants.services import permissions_of
from tests.console_data import story_run

# Runs before any page script; the listener sees every CSP violation of the document.
WATCH_CSP = """
window.__csp = [];
document.addEventListener('securitypolicyviolation', (e) => {
  const where = location.pathname + ' ' + (e.sourceFile || '') + ':' + e.lineNumber;
  window.__csp.push(e.violatedDirective + ' ' + (e.blockedURI || 'inline') + ' at ' + where);
});
"""


@pytest.fixture
def watched(page):  # noqa: ANN001
    page.add_init_script(WATCH_CSP)
    return page


def violations(page) -> list[str]:  # noqa: ANN001
    return page.evaluate("window.__csp")


def test_an_admin_works_the_members_page_through_htmx_without_a_violation(
    live_server, watched, login, alice, bob, acme, workflow, screenshot
):  # noqa: ANN001
    story_run(acme, bob)
    page = watched
    login(page, alice)
    for address in ("/runs/", "/audit/?action=member.role_set", "/approvals/", "/health/"):
        page.goto(live_server.url + address)
        expect(page.locator("main h1")).to_be_visible()
    page.goto(live_server.url + "/members/")
    expect(page.get_by_role("heading", name=re.compile("Members of"))).to_be_visible()
    # A marker on window survives an htmx swap but not a page load.
    page.evaluate("window.__same_page = true")
    row = page.locator(f"#member-{bob.pk}")
    row.get_by_label("Role of bob").select_option("reviewer")
    row.get_by_role("button", name="Set role").click()
    expect(page.locator("#members-section")).to_contain_text("bob is now reviewer.")
    assert page.evaluate("window.__same_page") is True
    assert permissions_of(user=bob, tenant=acme) == {roles.REVIEW}
    screenshot(page, "members-after-role-change")

    # Removing asks first (htmx's hx-confirm), then swaps the section.
    page.once("dialog", lambda dialog: dialog.accept())
    page.locator(f"#member-{bob.pk}").get_by_role("button", name="Remove bob").click()
    expect(page.locator("#members-section")).to_contain_text("bob was removed")
    expect(page.locator(f"#member-{bob.pk}")).to_have_count(0)
    assert page.evaluate("window.__same_page") is True
    assert violations(page) == []


def test_the_policy_refuses_an_inline_script_and_the_watch_sees_it(
    live_server, watched, login, alice
):  # noqa: ANN001
    """The control for the test above: a violation would have been seen."""
    page = watched
    login(page, alice)
    page.goto(live_server.url + "/members/")
    page.evaluate(
        """() => {
        const s = document.createElement('script');
        s.textContent = 'window.__ran = true';
        document.body.appendChild(s);
    }"""
    )
    page.wait_for_function("window.__csp.length > 0")
    assert page.evaluate("window.__ran === undefined")
    assert any(v.startswith("script-src") for v in violations(page))
    page.console_errors.clear()  # the refusal is logged as an error on purpose
