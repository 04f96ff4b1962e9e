"""Every stored workflow definition declares the action of each approval state (issue 24).

An approval is bound to an action, and the commit that leaves an approval state holds it to
the action its definition declares. A definition stored before declares none: it gets the
action its effect state performs (``approval_action_default``: the first effect state a run
reaches from the approval state; a declarative effect state performs the action named like
it), the default the API applies to a definition registered without one. Its sha256 is
computed again, so registering the same definition again stays idempotent.

Live approval requests keep their action; one whose action is not the declared one no longer
lets its run pass (the run asks again), which is the point.
"""

from django.db import migrations


def declare_actions(apps, schema_editor):
    from cairn.errors import InvalidDefinition
    from checkpoints.services.workflows import definition_normalize, definition_sha256

    WorkflowDefinition = apps.get_model("checkpoints", "WorkflowDefinition")
    for row in WorkflowDefinition.objects.using(schema_editor.connection.alias).iterator():
        definition = row.definition or {}
        if not definition.get("approval_states") or definition.get("approvals"):
            continue
        try:
            normal = definition_normalize(definition)
        except InvalidDefinition:
            continue  # never stored by Cairn: left as it is, and refused where it is used
        row.definition = normal
        row.definition_sha256 = definition_sha256(normal)
        row.save(update_fields=["definition", "definition_sha256"])


class Migration(migrations.Migration):
    dependencies = [("checkpoints", "0012_artifact_uploads")]

    operations = [migrations.RunPython(declare_actions, migrations.RunPython.noop)]
