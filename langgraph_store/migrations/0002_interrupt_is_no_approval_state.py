"""A LangGraph thread's ``interrupted`` state is no approval state (issue 24).

The generic workflow LangGraph threads follow declared ``interrupted`` an approval state, and
the store's commits were exempt from the approval rule when they left it. Every writer is
now held to the rule without exemption, so the definition says what an interrupt is: a
state where the run waits for a person's answer (the store's commits show it as
``waiting_approval``), gated by no Cairn approval. The stored row (tenant-less, version 1)
gets that definition and its sha256, so the store registering it stays idempotent.
"""

from django.db import migrations

DEFINITION = {
    "initial": "running",
    "states": ["running", "interrupted"],
    "transitions": [["running", "interrupted"], ["interrupted", "running"]],
    "terminal": [],
    "approval_states": [],
    "effect_states": [],
}


def interrupt_is_no_approval_state(apps, schema_editor):
    from checkpoints.services.workflows import definition_sha256

    WorkflowDefinition = apps.get_model("checkpoints", "WorkflowDefinition")
    WorkflowDefinition.objects.using(schema_editor.connection.alias).filter(
        tenant__isnull=True, workflow_type="langgraph", version="1"
    ).update(definition=DEFINITION, definition_sha256=definition_sha256(DEFINITION))


class Migration(migrations.Migration):
    dependencies = [
        ("langgraph_store", "0001_initial"),
        ("checkpoints", "0013_definitions_declare_approval_actions"),
    ]

    operations = [
        migrations.RunPython(interrupt_is_no_approval_state, migrations.RunPython.noop)
    ]
