"""The console screenshots the README shows, taken in a real browser from data the real demo
workflow made: the runs list, a finished run's page with its checkpoint timeline and step
history, a bulk cancel's dry run, and a reviewer's page for a draft under review.

By default each screenshot goes to a temporary directory and is checked to be a real,
non-blank PNG of the viewport's size. ``CAIRN_SCREENSHOTS_DIR=docs/images`` writes them
into the repository instead, to refresh the committed ones (see docs/console.md)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from django.test import override_settings
from PIL import Image
from playwright.sync_api import expect

from approvals.models import ApprovalRequest, ApprovalStatus
from checkpoints.models import Run, RunStatus
from runtime.demo import DEMO_QUESTIONS
from runtime.executor import run_advance
from runtime.services.runs import run_create
from tenants.services import Actor, member_set_role
from tests.approvals_support import decide
from tests.factories import TenantFactory, UserFactory

ROOT = Path(__file__).resolve().parents[2]
VIEWPORT = {"width": 1280, "height": 800}
# Every committed image the README embeds; the test writes each of them.
SCREENSHOTS = ("runs", "run", "bulk", "review")


@pytest.fixture
def demo(db):  # noqa: ANN001
    """The demo tenant with an operator and a reviewer, as ``make run`` seeds it."""
    tenant = TenantFactory(slug="demo", name="Demo")
    people = {}
    for role in ("operator", "reviewer"):
        people[role] = UserFactory(username=role)
        member_set_role(tenant=tenant, user=people[role], role=role, actor=Actor.system("test"))
    return tenant, people


def advance(run: Run, until: set[str]) -> Run:
    """Drive ``run`` with the real executor in this process until its status is in ``until``."""
    for _ in range(20):
        run.refresh_from_db()
        if run.status in until:
            return run
        run_advance(run_id=run.pk, expected_version=run.version, owner="celery@demo")
    pytest.fail(f"run {run.pk} stayed {run.status}, not {sorted(until)}")


def pending_request(run: Run) -> ApprovalRequest:
    return ApprovalRequest.objects.get(run=run, status=ApprovalStatus.PENDING)


@pytest.fixture
def demo_runs(demo, publishing_service, settings):  # noqa: ANN001
    """Demo research runs the way the tour finds them: one published, one rejected by the
    reviewer, the rest waiting for review, and one just started."""
    settings.CAIRN_PUBLISHING_URL = publishing_service.url
    tenant, people = demo
    started_by = Actor(user=people["operator"])
    runs = []
    for question in (*DEMO_QUESTIONS, "Which cairns mark a summit, and which a trail?"):
        run = run_create(
            tenant=tenant,
            workflow_type="research",
            inputs={"question": question},
            objective_ref="demo:research",
            budget={"max_attempts": 20, "max_tokens": 50000, "max_cost": 1.0},
            actor=started_by,
        )
        runs.append(advance(run, {RunStatus.WAITING_APPROVAL}))
    published, rejected, *_ = runs
    decide(pending_request(published), people["reviewer"])
    advance(published, {RunStatus.SUCCEEDED})
    decide(
        pending_request(rejected),
        people["reviewer"],
        "reject",
        comment="Source 2 is not cited.",
    )
    advance(rejected, {RunStatus.FAILED})
    # Started last, not yet picked up by a worker: the list shows a run in every stage.
    run_create(
        tenant=tenant,
        workflow_type="research",
        inputs={"question": "What should a hiker do with a fallen cairn?"},
        objective_ref="demo:research",
        budget={"max_attempts": 20, "max_tokens": 50000, "max_cost": 1.0},
        actor=started_by,
    )
    return {"published": published, "waiting": runs[2]}


@pytest.fixture
def shots(tmp_path) -> Path:  # noqa: ANN001
    """Where screenshots go: the repository's directory when asked for, else a temp dir."""
    wanted = os.environ.get("CAIRN_SCREENSHOTS_DIR")
    if not wanted:
        return tmp_path
    target = Path(wanted) if Path(wanted).is_absolute() else ROOT / wanted
    target.mkdir(parents=True, exist_ok=True)
    return target


def assert_real_screenshot(path: Path) -> None:
    """A PNG of the viewport's size that shows a page, not a blank or one-colour frame."""
    with Image.open(path) as image:
        assert image.format == "PNG"
        assert image.size == (VIEWPORT["width"], VIEWPORT["height"])
        colours = image.convert("RGB").getcolors(maxcolors=1 << 16)
    # getcolors answers None past maxcolors: far more colours than a blank page has.
    assert colours is None or len(colours) > 50, f"{path.name} is nearly blank: {colours}"


def take(page, shots: Path, name: str) -> Path:  # noqa: ANN001
    path = shots / f"{name}.png"
    page.screenshot(path=str(path))
    assert_real_screenshot(path)
    return path


@override_settings(CAIRN_CONSOLE_REFRESH_SECONDS=3600)  # a still page while it is taken
def test_the_readme_screenshots_show_the_demo_in_the_console(
    live_server,
    browser,
    login,
    demo,
    demo_runs,
    shots,  # noqa: ANN001
):
    _, people = demo
    context = browser.new_context(viewport=VIEWPORT)
    page = context.new_page()
    try:
        login(page, people["operator"])
        page.goto(f"{live_server.url}/runs/")
        expect(page.locator("tbody tr")).to_have_count(5)
        expect(page.locator("body")).to_contain_text("Waiting Approval 2")
        take(page, shots, "runs")

        published = demo_runs["published"]
        page.goto(f"{live_server.url}/runs/{published.pk}/")
        expect(page.locator("body")).to_contain_text("Succeeded")
        # The tour shows the path taken and the timeline, below the snapshot.
        page.locator("#machine-title").evaluate("heading => heading.scrollIntoView()")
        expect(page.locator("#timeline-title")).to_be_in_viewport()
        take(page, shots, "run")

        # A bulk action's dry run: every run the list's filter selects, and what each
        # would do or why it is refused, before anything changes.
        page.goto(f"{live_server.url}/runs/")
        page.get_by_role("link", name="Act on every run matching these filters…").click()
        page.get_by_label("Action").select_option("cancel")
        page.get_by_label("Reason").fill("the demo questions are answered elsewhere")
        page.get_by_role("button", name="Review what will happen").click()
        expect(page.locator("[data-actionable]")).to_have_text("3")
        expect(page.locator("[data-refused]")).to_have_text("2")
        take(page, shots, "bulk")

        page.context.clear_cookies()
        login(page, people["reviewer"])
        request = pending_request(demo_runs["waiting"])
        page.goto(f"{live_server.url}/approvals/{request.pk}/")
        expect(page.get_by_role("button", name="Approve")).to_be_visible()
        expect(page.locator("body")).to_contain_text(request.artifact_sha256)
        take(page, shots, "review")
    finally:
        context.close()
    assert all((shots / f"{name}.png").is_file() for name in SCREENSHOTS)
