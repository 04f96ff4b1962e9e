"""Request parsing and response shapes of API v1. No domain logic: services decide."""

from __future__ import annotations

from typing import Any

from rest_framework import serializers

from checkpoints.models import Artifact, Checkpoint, Execution, Run, WorkflowDefinition
from checkpoints.services.budgets import BUDGET_LIMIT_MAX, budget_remaining


def _json_type_problem(field: serializers.Field, value: Any) -> str | None:
    """Why ``value`` is not of the JSON type the schema gives ``field`` (DRF would coerce
    0 to "0", "5" to 5, "true" to True), or None."""
    if value is None:
        return None
    if isinstance(field, serializers.CharField) and not isinstance(value, str):
        return "Must be a string."
    if isinstance(field, serializers.BooleanField) and not isinstance(value, bool):
        return "Must be true or false."
    if isinstance(field, serializers.IntegerField) and (
        isinstance(value, bool) or not isinstance(value, int)
    ):
        return "Must be a whole number."
    if isinstance(field, serializers.FloatField) and (
        isinstance(value, bool) or not isinstance(value, int | float)
    ):
        return "Must be a number."
    return None


class StrictSerializer(serializers.Serializer):
    """What the OpenAPI document says is what is accepted: unknown fields are an error, not
    silently dropped (a typo must not lose data), and a value of another JSON type than its
    field's is an error, not coerced (``{"reason": 0}`` is not the reason "0")."""

    def to_internal_value(self, data: Any) -> Any:
        if isinstance(data, dict):
            unknown = set(data) - set(self.fields)
            if unknown:
                raise serializers.ValidationError({k: ["Unknown field."] for k in sorted(unknown)})
            mistyped = {
                name: [problem]
                for name, field in self.fields.items()
                if name in data and (problem := _json_type_problem(field, data[name]))
            }
            if mistyped:
                raise serializers.ValidationError(mistyped)
        return super().to_internal_value(data)


class ErrorSerializer(serializers.Serializer):
    code = serializers.CharField()
    detail = serializers.CharField()
    fields = serializers.DictField(child=serializers.CharField(), required=False)


# --- workflows ---------------------------------------------------------------------------
class WorkflowDefinitionInSerializer(serializers.Serializer):
    initial = serializers.CharField()
    states = serializers.ListField(child=serializers.CharField())
    transitions = serializers.ListField(child=serializers.ListField(child=serializers.CharField()))
    terminal = serializers.ListField(child=serializers.CharField(), required=False)
    approval_states = serializers.ListField(child=serializers.CharField(), required=False)
    effect_states = serializers.ListField(child=serializers.CharField(), required=False)
    steps = serializers.DictField(child=serializers.CharField(), required=False)


class WorkflowSerializer(serializers.ModelSerializer):
    definition = serializers.JSONField()
    source = serializers.SerializerMethodField()

    class Meta:
        model = WorkflowDefinition
        fields = [
            "workflow_type",
            "version",
            "definition",
            "definition_sha256",
            "has_code",
            "source",
            "created_at",
        ]

    def get_source(self, obj: WorkflowDefinition) -> str:
        return "code" if obj.tenant_id is None else "api"


# --- runs --------------------------------------------------------------------------------
class BudgetInSerializer(StrictSerializer):
    max_attempts = serializers.IntegerField(
        min_value=1, max_value=BUDGET_LIMIT_MAX, required=False, allow_null=True
    )
    max_tokens = serializers.IntegerField(
        min_value=1, max_value=BUDGET_LIMIT_MAX, required=False, allow_null=True
    )
    max_cost = serializers.FloatField(
        min_value=0, max_value=BUDGET_LIMIT_MAX, required=False, allow_null=True
    )
    deadline = serializers.DateTimeField(required=False, allow_null=True)


class RunCreateSerializer(StrictSerializer):
    workflow_type = serializers.CharField(max_length=100)
    workflow_version = serializers.CharField(max_length=50, required=False)
    inputs = serializers.DictField(required=False, default=dict)
    objective_ref = serializers.CharField(
        max_length=500, required=False, default="", allow_blank=True
    )
    budget = BudgetInSerializer(required=False)
    execution = serializers.ChoiceField(choices=Execution.values, required=False)


class RunSerializer(serializers.ModelSerializer):
    budget_remaining = serializers.SerializerMethodField()
    forked_from_checkpoint = serializers.SerializerMethodField()

    class Meta:
        model = Run
        fields = [
            "id",
            "workflow_type",
            "workflow_version",
            "execution",
            "objective_ref",
            "state",
            "step",
            "status",
            "status_reason",
            "paused",
            "pause_reason",
            "version",
            "checkpoint_sequence",
            "latest_checkpoint_sha256",
            "restore_count",
            "budget_limits",
            "budget_used",
            "budget_remaining",
            "lease_owner",
            "lease_expires_at",
            "next_eligible_at",
            "forked_from_run",
            "forked_from_checkpoint",
            "created_at",
            "updated_at",
        ]

    def get_budget_remaining(self, run: Run) -> dict[str, Any]:
        return budget_remaining(run)

    def get_forked_from_checkpoint(self, run: Run) -> int | None:
        """The sequence of the source checkpoint in ``forked_from_run``."""
        return run.forked_from_checkpoint.sequence if run.forked_from_checkpoint_id else None


# --- checkpoints -------------------------------------------------------------------------
class CheckpointCommitSerializer(StrictSerializer):
    expected_version = serializers.IntegerField(min_value=1)
    state = serializers.CharField(max_length=100)
    step = serializers.CharField(max_length=100, required=False, default="", allow_blank=True)
    envelope = serializers.DictField()
    status = serializers.ChoiceField(
        choices=[
            "running",
            "waiting_approval",
            "waiting_retry",
            "paused_for_review",
            "failed",
            "succeeded",
        ],
        required=False,
    )
    status_reason = serializers.CharField(
        max_length=2000, required=False, default="", allow_blank=True
    )
    lease_owner = serializers.CharField(max_length=200, required=False)
    # Which runner code wrote the checkpoint (recorded in the envelope's compatibility).
    code_version = serializers.CharField(
        max_length=50, required=False, default="", allow_blank=True
    )


class CommitResultSerializer(serializers.Serializer):
    sequence = serializers.IntegerField()
    sha256 = serializers.CharField()
    parent_sha256 = serializers.CharField()
    run_version = serializers.IntegerField()


class CheckpointSerializer(serializers.ModelSerializer):
    class Meta:
        model = Checkpoint
        fields = [
            "sequence",
            "state",
            "step",
            "sha256",
            "parent_sha256",
            "schema_version",
            "actor",
            "created_at",
        ]


class CheckpointDetailSerializer(CheckpointSerializer):
    envelope = serializers.SerializerMethodField()

    class Meta(CheckpointSerializer.Meta):
        fields = [*CheckpointSerializer.Meta.fields, "envelope"]

    def get_envelope(self, obj: Checkpoint) -> dict[str, Any]:
        return self.context["envelope"]


class VerifySerializer(serializers.Serializer):
    ok = serializers.BooleanField()
    checkpoints = serializers.IntegerField()
    problems = serializers.ListField(child=serializers.CharField())


# --- artifacts -----------------------------------------------------------------------------
class ArtifactSerializer(serializers.ModelSerializer):
    class Meta:
        model = Artifact
        fields = ["id", "sha256", "size", "media_type", "kind", "created_at"]


# --- leases --------------------------------------------------------------------------------
class LeaseInSerializer(StrictSerializer):
    owner = serializers.CharField(max_length=200)
    ttl_seconds = serializers.IntegerField(min_value=1, max_value=3600)
    expected_version = serializers.IntegerField(min_value=1)


class LeaseSerializer(serializers.Serializer):
    run_id = serializers.UUIDField()
    owner = serializers.CharField()
    expires_at = serializers.DateTimeField()
    run_version = serializers.IntegerField()
    restore_count = serializers.IntegerField()
