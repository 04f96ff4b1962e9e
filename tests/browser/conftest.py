"""Shared real-browser fixtures: Debian's Chromium driven by Playwright, never a download.

Use with pytest-django's ``live_server``::

    def test_it_shows_the_runs(live_server, page, login, bob):
        login(page, bob)
        page.goto(live_server.url + "/runs/")

Screenshots go to ``test-artifacts/`` (git-ignored; CI keeps it as an artifact).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

CHROMIUM = os.environ.get("CAIRN_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
PASSWORD = "correct horse battery staple"  # tests.factories.UserFactory's password
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"


def pytest_collection_modifyitems(config, items):  # noqa: ANN001
    here = str(Path(__file__).parent)
    for item in items:
        if str(item.fspath).startswith(here):
            item.add_marker(pytest.mark.browser)


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    """One Chromium per test module.

    Playwright's sync API runs an event loop in this thread while it is open, so it must not
    outlive the browser tests (later tests call asyncio.run); and the ORM calls tests make
    between browser steps are synchronous, so Django's async guard stands aside meanwhile.
    """
    from playwright.sync_api import sync_playwright

    saved = os.environ.get("DJANGO_ALLOW_ASYNC_UNSAFE")
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    try:
        with sync_playwright() as playwright:
            chromium = playwright.chromium.launch(
                executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS
            )
            yield chromium
            chromium.close()
    finally:
        if saved is None:
            os.environ.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
        else:
            os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = saved


@pytest.fixture
def page(browser) -> Iterator[object]:  # noqa: ANN001
    """A fresh browser context (own cookies) at 1280×900.

    Fails the test on a browser console error (a CSP violation, a script error, a missing
    asset) or a server error; ``page.console_errors`` lets a test expect one on purpose
    (clear it before the test ends).
    """
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    context.set_default_timeout(10_000)
    page = context.new_page()
    errors: list[str] = []
    # A CSP violation or a script error shows up here: the console must have none.
    page.on("console", lambda msg: errors.append(msg.text) if msg.type == "error" else None)
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.on(
        "response",
        lambda r: errors.append(f"{r.status} {r.url}") if r.status >= 500 else None,
    )
    # An htmx poll cut short by a navigation is aborted on purpose; anything else is not.
    page.on(
        "requestfailed",
        lambda r: None if "ABORTED" in (r.failure or "") else errors.append(f"failed {r.url}"),
    )
    page.console_errors = errors
    yield page
    context.close()
    assert not errors, f"the browser reported errors: {errors}"


@pytest.fixture
def login(live_server) -> Callable[..., None]:  # noqa: ANN001
    """login(page, user): sign in through the console's login form, like a person would."""

    def sign_in(page, user, password: str = PASSWORD) -> None:  # noqa: ANN001
        page.goto(live_server.url + "/login/")
        page.get_by_label("Username").fill(user.get_username())
        page.get_by_label("Password").fill(password)
        page.get_by_role("button", name="Sign in").click()
        page.wait_for_url(lambda url: "/login/" not in url)

    return sign_in


@pytest.fixture
def screenshot() -> Callable[..., Path]:
    """screenshot(page, name) → path of a full-page PNG under test-artifacts/."""

    def take(page, name: str) -> Path:  # noqa: ANN001
        ARTIFACTS.mkdir(exist_ok=True)
        path = ARTIFACTS / f"{name}.png"
        page.screenshot(path=str(path), full_page=True)
        return path

    return take
