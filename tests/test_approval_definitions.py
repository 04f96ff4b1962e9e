"""A workflow definition declares the action of each approval state (issue 24): the API's
definitions, Python-declared workflows and definitions stored before, migrated with the
action their effect state performs."""

from __future__ import annotations

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from cairn.errors import InvalidDefinition
from checkpoints.models import WorkflowDefinition
from checkpoints.services.workflows import (
    definition_normalize,
    definition_sha256,
    states_behind,
    workflow_register,
)
from runtime import Workflow
from runtime.definition import WorkflowDeclarationError
from runtime.registry import workflows_sync
from tests.factories import SIMPLE_DEFINITION

OLD_FORM = {k: v for k, v in definition_normalize(SIMPLE_DEFINITION).items() if k != "approvals"}


def test_a_definition_without_an_action_gets_the_one_its_effect_state_performs():
    normal = definition_normalize(SIMPLE_DEFINITION)
    assert normal["approvals"] == {"review": {"action": "publish"}}
    declared = definition_normalize(
        {**SIMPLE_DEFINITION, "approvals": {"review": {"action": "ship"}}}
    )
    assert declared["approvals"] == {"review": {"action": "ship"}}
    # No effect after it: the state an approval leads to.
    plain = {**SIMPLE_DEFINITION, "effect_states": []}
    assert definition_normalize(plain)["approvals"] == {"review": {"action": "publish"}}


@pytest.mark.parametrize(
    ("approvals", "field"),
    [
        ({"publish": {"action": "x"}}, "approvals.publish"),
        ({"review": {"action": ""}}, "approvals.review.action"),
        ({"review": {"action": "x" * 101}}, "approvals.review.action"),
        ({"review": {"action": "x", "delegates": 2}}, "approvals.review"),
        (["review"], "approvals"),
    ],
)
def test_a_malformed_approval_declaration_is_refused_by_field(approvals, field):
    with pytest.raises(InvalidDefinition) as refused:
        definition_normalize({**SIMPLE_DEFINITION, "approvals": approvals})
    assert field in refused.value.fields


def test_the_states_past_an_approval_state_are_those_reached_only_through_it():
    definition = definition_normalize(
        {
            "initial": "draft",
            "states": ["draft", "review", "publish", "notify", "done", "rejected"],
            "transitions": [
                ["draft", "review"],
                ["review", "publish"],
                ["review", "rejected"],
                ["review", "draft"],  # a redraft loop: draft stays before the approval
                ["publish", "notify"],
                ["notify", "draft"],  # and after publishing, back to drafting
                ["notify", "done"],
            ],
            "terminal": ["done", "rejected"],
            "approval_states": ["review"],
            "effect_states": ["publish"],
        }
    )
    assert states_behind(definition) == {
        "review": frozenset({"publish", "notify", "done", "rejected"})
    }


def test_a_python_workflow_declares_the_action_of_its_effect_state_and_no_other():
    wf = Workflow("declares", version="1", register=False)
    wf.add_step("draft", lambda ctx: {}, next="review")
    wf.approval("review", next="publish", rejected="rejected")
    wf.add_step("publish", lambda ctx: {}, next="done", effect_action="post_article")
    wf.terminal("done", "rejected")
    assert wf.definition()["approvals"] == {"review": {"action": "post_article"}}
    other = Workflow("declares_other", version="1", register=False)
    other.add_step("draft", lambda ctx: {}, next="review")
    other.approval("review", next="publish", action="publish")
    other.add_step("publish", lambda ctx: {}, next="done", effect_action="delete_site")
    other.terminal("done")
    with pytest.raises(WorkflowDeclarationError, match="performs 'delete_site'"):
        other.definition()


BEFORE = [("checkpoints", "0012_artifact_uploads"), ("langgraph_store", "0001_initial")]


@pytest.mark.django_db(transaction=True)
def test_stored_definitions_are_migrated_to_declare_their_approval_action(acme):  # noqa: ANN001
    executor = MigrationExecutor(connection)
    executor.migrate(BEFORE)
    old = executor.loader.project_state(BEFORE).apps.get_model("checkpoints", "WorkflowDefinition")
    try:
        old.objects.create(
            tenant_id=acme.pk,
            workflow_type="stored-before",
            version="1",
            definition=OLD_FORM,
            definition_sha256=definition_sha256(OLD_FORM),
        )
        langgraph = {
            "initial": "running",
            "states": ["running", "interrupted"],
            "transitions": [["running", "interrupted"], ["interrupted", "running"]],
            "terminal": [],
            "approval_states": ["interrupted"],
            "effect_states": [],
        }
        from runtime.demo import research

        demo = {k: v for k, v in research.definition().items() if k != "approvals"}
        old.objects.create(
            workflow_type="research",
            version="1",
            definition=demo,
            definition_sha256=definition_sha256(demo),
            has_code=True,
        )
        old.objects.create(
            workflow_type="langgraph",
            version="1",
            definition=langgraph,
            definition_sha256=definition_sha256(langgraph),
        )
    finally:
        MigrationExecutor(connection).migrate(
            MigrationExecutor(connection).loader.graph.leaf_nodes()
        )
    row = WorkflowDefinition.objects.get(workflow_type="stored-before")
    assert row.definition["approvals"] == {"review": {"action": "publish"}}
    assert row.definition_sha256 == definition_sha256(row.definition)
    # Registering the same definition again is still the same definition.
    again, created = workflow_register(
        tenant=acme, workflow_type="stored-before", version="1", definition=OLD_FORM
    )
    assert (again.pk, created) == (row.pk, False)
    # A LangGraph interrupt waits for an answer; it is no approval state any more.
    lg = WorkflowDefinition.objects.get(workflow_type="langgraph", tenant__isnull=True)
    assert lg.definition["approval_states"] == [] and "approvals" not in lg.definition
    from langgraph_store.threads import langgraph_workflow_register

    assert langgraph_workflow_register().pk == lg.pk
    # Code workflows declare what the migration wrote for them (the demo's research).
    outcomes = {str(w): outcome for w, outcome in workflows_sync()}
    assert outcomes["<Workflow research@1>"] == "unchanged", outcomes
