"""Restore guards a runner cannot talk its way past: a checkpoint sealed under a key this
process lacks pauses the run (naming the key id) instead of raising out of the task forever;
a secret reference a step declares must resolve before the next step runs; a checkpoint
written by a code version the code does not declare compatible pauses the run."""

from __future__ import annotations

import pytest

from checkpoints.crypto import new_key_spec
from checkpoints.models import OutboxMessage, Run, RunStatus
from runtime import Workflow
from runtime.definition import registry_add
from runtime.rescue import runs_rescue
from tests.runtime_support import advance, start

pytestmark = pytest.mark.django_db

guarded = Workflow("guarded", version="1", code_version="2")


@guarded.step("fetch", next="send", secrets=["env:CAIRN_TEST_GUARDED_TOKEN"])
def fetch(ctx):  # noqa: ANN001, ANN201
    return {"fetched": True}


@guarded.step("send", next="done")
def send(ctx):  # noqa: ANN001, ANN201
    return {"sent": True}


guarded.terminal("done")


spendthrift = Workflow("spendthrift", version="1")


@spendthrift.step("think", next="done")
def think_once(ctx):  # noqa: ANN001, ANN201
    ctx.model.complete(prompt="think about cairns at length " * 20)
    return {"thought": True}


spendthrift.terminal("done")


def test_a_worker_step_that_spends_past_its_token_limit_fails_the_run(acme):
    """Cairn's workers are held to the same rule as any writer: the step's commit with usage
    over the limit is refused, and the run fails recording that usage."""
    run = start(acme, "spendthrift", budget={"max_attempts": 5, "max_tokens": 5})
    assert advance(run) == "failed"
    run.refresh_from_db()
    assert run.status_reason.startswith("budget exhausted: tokens used")
    assert run.budget_used["tokens_used"] > 5
    assert run.state == "think"  # the step's move to done was not accepted


def _paused(run: Run) -> Run:
    run.refresh_from_db()
    assert run.status == RunStatus.PAUSED_FOR_REVIEW, (run.status, run.status_reason)
    assert run.lease_owner == ""
    return run


def test_a_checkpoint_sealed_under_a_missing_key_pauses_the_run_naming_the_key(
    acme, settings, monkeypatch
):
    monkeypatch.setenv("CAIRN_TEST_GUARDED_TOKEN", "t0ken-value-never-shown")
    settings.CAIRN_STEPS_PER_TASK = 1
    run = start(acme, "guarded")
    assert advance(run) == "handed_over"
    key_id = settings.CAIRN_ENCRYPTION_KEYS.split(":", 1)[0]
    # This worker has another key only: it cannot read what the run wrote.
    settings.CAIRN_ENCRYPTION_KEYS = new_key_spec("other")
    assert advance(run) == "paused"
    run = _paused(run)
    assert f"encryption key '{key_id}'" in run.status_reason
    assert run.checkpoint_sequence == 2  # no checkpoint written
    # The sweep leaves a paused run alone: no command is queued for it, now or later.
    before = OutboxMessage.objects.filter(run=run, kind="run.resume", sent_at__isnull=True).count()
    run.updated_at = run.updated_at.replace(year=2000)
    Run.objects.filter(pk=run.pk).update(updated_at=run.updated_at)
    assert runs_rescue() == 0
    after = OutboxMessage.objects.filter(run=run, kind="run.resume", sent_at__isnull=True).count()
    assert after == before
    assert advance(run) == "inactive"


def test_a_secret_reference_that_no_longer_resolves_pauses_the_run_naming_the_reference(
    acme, settings, monkeypatch
):
    monkeypatch.setenv("CAIRN_TEST_GUARDED_TOKEN", "t0ken-value-never-shown")
    settings.CAIRN_STEPS_PER_TASK = 1
    run = start(acme, "guarded")
    assert advance(run) == "handed_over"  # fetch ran: the reference resolved
    monkeypatch.delenv("CAIRN_TEST_GUARDED_TOKEN")
    assert advance(run) == "paused"
    run = _paused(run)
    assert "env:CAIRN_TEST_GUARDED_TOKEN" in run.status_reason
    assert "step fetch" in run.status_reason
    assert run.state == "send" and run.checkpoint_sequence == 2  # send did not run


def test_an_unresolvable_reference_pauses_the_run_before_its_first_step(acme, monkeypatch):
    monkeypatch.setenv("CAIRN_TEST_GUARDED_TOKEN", "")  # set but empty: unresolvable
    run = start(acme, "guarded")
    assert advance(run) == "paused"
    run = _paused(run)
    assert "env:CAIRN_TEST_GUARDED_TOKEN" in run.status_reason
    assert run.checkpoint_sequence == 1  # paused before the first step


@pytest.fixture
def deploy_code_version():
    """deploy(code_version, compatible) replaces guarded@1's code (same states and steps)."""

    def deploy(code_version: str, compatible: list[str] | None) -> None:
        code = Workflow(
            "guarded",
            version="1",
            code_version=code_version,
            compatible_code_versions=compatible,
            register=False,
        )
        code.add_step("fetch", fetch, next="send", secrets=["env:CAIRN_TEST_GUARDED_TOKEN"])
        code.add_step("send", send, next="done")
        code.terminal("done")
        registry_add(code)

    yield deploy
    registry_add(guarded)


def test_a_checkpoint_from_an_incompatible_code_version_pauses_the_run(
    acme, settings, monkeypatch, deploy_code_version
):
    monkeypatch.setenv("CAIRN_TEST_GUARDED_TOKEN", "x")
    settings.CAIRN_STEPS_PER_TASK = 1
    run = start(acme, "guarded")
    assert advance(run) == "handed_over"  # checkpoint 2 written by code version 2
    deploy_code_version("4", ["3"])
    assert advance(run) == "paused"
    run = _paused(run)
    assert "code version '2'" in run.status_reason
    assert "compatible: 3, 4" in run.status_reason
    assert run.checkpoint_sequence == 2


def test_a_checkpoint_from_a_declared_compatible_code_version_continues(
    acme, settings, monkeypatch, deploy_code_version
):
    monkeypatch.setenv("CAIRN_TEST_GUARDED_TOKEN", "x")
    settings.CAIRN_STEPS_PER_TASK = 1
    run = start(acme, "guarded")
    assert advance(run) == "handed_over"
    deploy_code_version("3", ["2"])
    assert advance(run) == "succeeded"  # send ran under code version 3
    run.refresh_from_db()
    assert (run.status, run.state) == (RunStatus.SUCCEEDED, "done")


def test_every_worker_checkpoint_records_prompt_policy_model_and_transition_versions(
    acme, monkeypatch
):
    monkeypatch.setenv("CAIRN_TEST_GUARDED_TOKEN", "x")
    run = start(acme, "guarded")
    assert advance(run) == "succeeded"
    from tests.runtime_support import envelope_at

    for sequence in (2, 3):
        envelope = envelope_at(run, sequence)
        inputs = envelope["inputs"]
        assert (inputs["prompt_version"], inputs["policy_version"]) == ("2", "2")
        assert inputs["model"] == "local-deterministic-1"
        assert inputs["values"] == {}  # the run's own inputs are kept
        assert envelope["position"]["transition_version"] == "1"  # guarded@1
        assert envelope["compatibility"]["workflow_code_version"] == "2"
