"""Pause and unpause from the console around a real worker that is mid-step (issue 29,
item 4): the preview says the step finishes, the step commits, the run stops, the runs list
counts and filters it, and Unpause lets it go on."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

import tests.runtime_workflows  # noqa: F401 - declares research_gated in this process too
from checkpoints.models import Checkpoint, Run, RunStatus
from runtime.services.runs import run_create
from tenants.models import AuditEvent
from tenants.services import Actor
from tests.runtime_workflows import GATED_STEPS
from tests.worker_fixtures import wait_for

pytestmark = [pytest.mark.worker, pytest.mark.django_db(transaction=True)]


def test_an_operator_pauses_a_run_mid_step_and_unpauses_it(
    live_server, page, login, screenshot, acme, bob, worker_factory, tmp_path, settings
):
    settings.CAIRN_CONSOLE_REFRESH_SECONDS = 1
    gate = tmp_path / "gate"
    gate.mkdir()
    (gate / "extract_claims.hold").write_text("hold")
    worker_factory("w1")
    run = run_create(
        tenant=acme,
        workflow_type="research_gated",
        inputs={"question": "Why build cairns?", "gate_dir": str(gate)},
        budget={"max_attempts": 20, "max_tokens": 100000, "max_cost": 10.0},
        actor=Actor.system("test"),
    )
    wait_for((gate / "extract_claims.entered").exists, what="the worker to enter the step")

    login(page, bob)
    page.goto(f"{live_server.url}/runs/{run.pk}/")
    actions = page.locator("#run-actions")
    actions.get_by_role("button", name="Pause…", exact=True).click()
    actions.get_by_label("Reason").fill("check the sources first")
    actions.get_by_role("button", name="Review what will happen").click()
    summary = actions.locator(".action-summary")
    expect(summary).to_contain_text("nothing dispatches it")
    expect(summary).to_contain_text("is running a step now: that step finishes and commits")
    actions.get_by_role("button", name="Pause the run").click()
    expect(page.get_by_role("status")).to_contain_text("Paused")
    expect(page.locator('[data-field="paused"]')).to_have_text("Paused")
    pause_button = page.locator("#run-actions").get_by_role("button", name="Pause…", exact=True)
    expect(pause_button).to_have_count(0)

    (gate / "extract_claims.hold").unlink()  # the step in flight finishes and commits
    wait_for(
        lambda: (
            Checkpoint.objects.filter(run=run, step="extract_claims").exists()
            and Run.objects.filter(pk=run.pk, lease_owner="").exists()
        ),
        what="the step in flight to commit and the worker to stop",
    )
    # The runs list counts it under Paused and filters by it.
    page.goto(f"{live_server.url}/runs/")
    chip = page.locator("#paused-chip")
    expect(chip.locator(".count")).to_have_text("1")
    chip.click()
    expect(page.locator("#run-rows tr[data-run-id]")).to_have_count(1)
    expect(page.locator(f"#run-{run.pk} [data-paused]")).to_have_text("paused")
    screenshot(page, "runs-paused")
    assert "draft_answer" not in {p.name.removesuffix(".runs") for p in gate.glob("*.runs")}

    page.goto(f"{live_server.url}/runs/{run.pk}/")
    actions = page.locator("#run-actions")
    actions.get_by_role("button", name="Unpause…").click()
    actions.get_by_role("button", name="Review what will happen").click()
    expect(actions.locator(".action-summary")).to_contain_text("The hold is lifted")
    actions.get_by_role("button", name="Unpause the run").click()
    expect(page.get_by_role("status")).to_contain_text("Unpaused")
    wait_for(
        lambda: Run.objects.filter(
            pk=run.pk, status=RunStatus.WAITING_APPROVAL, lease_owner=""
        ).exists(),
        what="the unpaused run to reach its approval",
    )
    ran = {p.name.removesuffix(".runs"): p.read_text().count("\n") for p in gate.glob("*.runs")}
    assert ran == {step: 1 for step in GATED_STEPS}
    actions = [e.action for e in AuditEvent.objects.filter(run_id=run.pk).order_by("id")]
    assert actions.count("run.pause") == 1 and actions.count("run.unpause") == 1
