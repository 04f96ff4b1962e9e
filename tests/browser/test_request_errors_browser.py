"""A failed htmx request is reported on the page (errors.js), not swallowed: here the run
page's snapshot poll after the operator lost their role in another place."""

from __future__ import annotations

from playwright.sync_api import expect

from tenants.services import Actor, member_set_role
from tests.console_data import story_run


def test_a_refused_poll_says_so_on_the_page(live_server, page, login, bob, acme, workflow):  # noqa: ANN001
    run = story_run(acme, bob)
    login(page, bob)
    page.goto(f"{live_server.url}/runs/{run.pk}/")
    banner = page.locator("#request-error")
    expect(page.locator('[data-field="version"]')).to_have_text(str(run.version))
    expect(banner).to_be_hidden()

    member_set_role(tenant=acme, user=bob, role="reviewer", actor=Actor.system("test"))
    # The next snapshot poll is a 403: the page says what happened instead of going stale.
    expect(banner).to_be_visible()
    expect(banner).to_contain_text("You may not do that here any more")
    expect(banner.get_by_role("link", name="Reload the page")).to_be_visible()
    # The refused poll stops asking: dismissed, the notice stays away.
    poll = page.locator("[data-poll-refused='403']")
    expect(poll).to_have_count(1)
    banner.get_by_role("button", name="Dismiss").click()
    expect(banner).to_be_hidden()
    page.wait_for_timeout(2500)  # more than two poll intervals (1 s in tests)
    expect(banner).to_be_hidden()
    # The browser logs the refused requests themselves; they are what this test provoked.
    assert all("403" in error for error in page.console_errors), page.console_errors
    page.console_errors.clear()
