"""The run and checkpoint pages in a real browser at 1280px and on a narrow screen: nothing
widens the page past the screen (full sha256 values, visually hidden link text in scrolling
tables), and the polled snapshot says when the run moved on after the page loaded."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from checkpoints.models import Run
from checkpoints.services.checkpoints import CommitRequest, checkpoint_commit
from tenants.services import Actor
from tests.console_data import story_run
from tests.protocol_support import approved_evidence

LONG_SHA = "819c11625dcd16dcd164204f45085f57c081c82528ce74e1d093ae9a6b34b03e"


@pytest.fixture
def published(acme, bob, workflow) -> Run:  # noqa: ANN001
    """A run whose latest checkpoint names a full sha256 in running text (as the demo's
    approval validator does) after artifacts and identity fields full of hashes."""
    run = story_run(acme, bob)
    checkpoint_commit(
        tenant=acme,
        run_id=run.pk,
        request=CommitRequest(
            expected_version=run.version,
            state="publish",
            step="review",
            envelope={
                # Leaving the approval state takes a granted approval (issue 15).
                "evidence": approved_evidence(
                    run,
                    {
                        "artifacts": [],
                        "validators": [
                            {
                                "name": "approval",
                                "passed": True,
                                "detail": f"'publish' approved by carol for sha256 {LONG_SHA}",
                            }
                        ],
                    },
                )
            },
            actor=Actor(user=bob),
        ),
    )
    run.refresh_from_db()
    return run


def overflow(page) -> int:  # noqa: ANN001
    """How many pixels the page is wider than the screen (0: it fits)."""
    return page.evaluate(
        "document.documentElement.scrollWidth - document.documentElement.clientWidth"
    )


@pytest.mark.parametrize("width", [1280, 390])
def test_the_run_and_checkpoint_pages_fit_the_screen(
    live_server,
    page,
    login,
    bob,
    published,
    screenshot,
    width,  # noqa: ANN001
):
    page.set_viewport_size({"width": width, "height": 900})
    login(page, bob)
    run_url = f"{live_server.url}/runs/{published.pk}/"
    page.goto(run_url)
    expect(page.locator("#validators")).to_contain_text(LONG_SHA)
    assert overflow(page) == 0
    page.goto(f"{run_url}checkpoints/{published.checkpoint_sequence}/")
    expect(page.locator("#group-position table.diff")).to_be_visible()
    assert overflow(page) == 0
    screenshot(page, f"checkpoint-detail-{width}")


def test_the_snapshot_brings_the_page_up_to_date_when_the_run_moves(
    live_server,
    page,
    login,
    bob,
    acme,
    workflow,  # noqa: ANN001
):
    run = story_run(acme, bob)
    login(page, bob)
    page.goto(f"{live_server.url}/runs/{run.pk}/")
    notice = page.locator("[data-snapshot-moved]")
    expect(page.locator('[data-field="version"]')).to_have_text(str(run.version))
    expect(notice).to_have_count(0)
    checkpoint_commit(
        tenant=acme,
        run_id=run.pk,
        request=CommitRequest(
            expected_version=run.version,
            state="publish",
            step="review",
            envelope={"evidence": approved_evidence(run)},
            actor=Actor(user=bob),
        ),
    )
    # The next poll shows the new version, says so, and brings the cards below with it.
    expect(page.locator('[data-field="version"]')).to_have_text(str(run.version + 1))
    expect(notice).to_contain_text(f"moved on from version {run.version} to {run.version + 1}")
    expect(page.locator('[data-field="action-version"]')).to_have_text(str(run.version + 1))
    expect(page.locator("#machine-title")).to_be_visible()
    # The poll after it finds nothing new: the notice goes.
    expect(notice).to_have_count(0)
