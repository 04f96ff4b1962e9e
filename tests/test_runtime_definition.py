"""Workflows declared in Python produce the API's declarative definition, are stored by
sync_workflows (or on first use), and refuse inconsistent declarations."""

from __future__ import annotations

import pytest
from django.core.management import CommandError, call_command

from checkpoints.models import WorkflowDefinition
from checkpoints.services.workflows import definition_normalize
from runtime import Workflow
from runtime.definition import WorkflowDeclarationError, registry_add, registry_remove
from runtime.demo import research
from tests.runtime_support import start


def test_the_research_workflow_declares_the_definition_the_api_stores():
    definition = research.definition()
    assert definition == definition_normalize(definition)
    assert definition["initial"] == "collect_sources"
    assert definition["transitions"] == [
        ["collect_sources", "extract_claims"],
        ["extract_claims", "draft_answer"],
        ["draft_answer", "validate_citations"],
        ["validate_citations", "request_approval"],
        ["request_approval", "publish"],
        ["request_approval", "rejected"],
        ["publish", "done"],
    ]
    assert definition["approval_states"] == ["request_approval"]
    assert definition["effect_states"] == ["publish"]
    assert definition["terminal"] == ["done", "rejected"]
    assert definition["steps"]["draft_answer"] == "draft_answer"


def test_a_declaration_leading_to_an_undeclared_state_is_refused():
    wf = Workflow("broken", version="1", register=False)
    wf.add_step("a", lambda ctx: None, next="nowhere")
    with pytest.raises(WorkflowDeclarationError, match="'nowhere', which is not declared"):
        wf.definition()


def test_a_state_declared_twice_is_refused():
    wf = Workflow("twice", version="1", register=False)
    wf.terminal("done")
    with pytest.raises(WorkflowDeclarationError, match="declared twice"):
        wf.terminal("done")


@pytest.mark.django_db
def test_sync_workflows_stores_code_definitions_once(capsys):
    call_command("sync_workflows")
    row = WorkflowDefinition.objects.get(workflow_type="research", version="1")
    assert (row.tenant_id, row.has_code) == (None, True)
    assert row.definition == research.definition()
    call_command("sync_workflows")
    assert "research@1: unchanged" in capsys.readouterr().out
    assert WorkflowDefinition.objects.filter(workflow_type="research").count() == 1


@pytest.mark.django_db
def test_a_run_of_an_unsynced_code_workflow_registers_it_and_runs_on_workers(acme):
    assert not WorkflowDefinition.objects.filter(workflow_type="research").exists()
    run = start(acme, "research")
    assert run.workflow.has_code and run.workflow.tenant_id is None
    assert run.execution == "worker"


@pytest.mark.django_db
def test_sync_workflows_fails_when_code_changed_a_stored_version():
    call_command("sync_workflows")
    changed = Workflow("research", version="1", register=False)
    changed.add_step("collect_sources", lambda ctx: None, next="done")
    changed.terminal("done")
    registry_add(changed)
    try:
        with pytest.raises(CommandError, match="differ from their stored definition"):
            call_command("sync_workflows")
    finally:
        registry_remove("research", "1")
        registry_add(research)
    stored = WorkflowDefinition.objects.get(workflow_type="research", version="1")
    assert stored.definition == research.definition()
