"""API v1 operator actions: POST /api/v1/runs/{id}/actions/<action>. Parse, call the
service, render the run. The services decide and record; see runtime.services.actions."""

from __future__ import annotations

from drf_spectacular.utils import (
    OpenApiParameter,
    OpenApiResponse,
    extend_schema,
    extend_schema_field,
)
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response

from api.serializers import ErrorSerializer, RunSerializer, StrictSerializer
from api.views import CairnAPIView, _errors
from cairn.errors import InvalidRequest
from checkpoints.services.budgets import BUDGET_LIMIT_MAX
from runtime.services.actions import MAX_REASON, run_grant_budget, run_resume
from runtime.services.cancel import run_cancel
from runtime.services.forks import run_fork, run_fork_preview
from runtime.services.pause import run_pause, run_unpause
from runtime.services.retry import run_retry
from tenants import roles


def _reason(required: bool = True) -> serializers.CharField:
    return serializers.CharField(
        max_length=MAX_REASON,
        required=required,
        allow_blank=not required,
        default="" if not required else serializers.empty,
        help_text="Why: recorded with the action in the audit trail.",
    )


def _expected_version(required: bool = False) -> serializers.IntegerField:
    return serializers.IntegerField(
        min_value=1,
        required=required,
        help_text="The run version the caller decided on; a stale one is refused with 409.",
    )


class ResumeInSerializer(StrictSerializer):
    expected_version = _expected_version(required=True)
    reason = _reason(required=False)


class CancelInSerializer(StrictSerializer):
    reason = _reason()
    expected_version = _expected_version()


class PauseInSerializer(StrictSerializer):
    reason = _reason()
    expected_version = _expected_version()


class UnpauseInSerializer(StrictSerializer):
    reason = _reason(required=False)
    expected_version = _expected_version()


class RetryInSerializer(StrictSerializer):
    step = serializers.CharField(max_length=100, help_text="A step name (or its state).")
    reason = _reason()
    expected_version = _expected_version()


class ForkInSerializer(StrictSerializer):
    from_sequence = serializers.IntegerField(min_value=1)
    inputs_patch = serializers.DictField(
        required=False,
        help_text="A JSON Merge Patch (RFC 7396) of the checkpoint's input values (not of the "
        'inputs group: {"lang": "de"}, not {"values": {...}}). A non-empty patch that '
        "changes nothing is refused.",
    )
    reason = _reason()
    expected_version = _expected_version()


class GrantBudgetInSerializer(StrictSerializer):
    attempts = serializers.IntegerField(min_value=1, max_value=BUDGET_LIMIT_MAX, required=False)
    tokens = serializers.IntegerField(min_value=1, max_value=BUDGET_LIMIT_MAX, required=False)
    cost = serializers.FloatField(min_value=0, max_value=BUDGET_LIMIT_MAX, required=False)
    deadline = serializers.DateTimeField(
        required=False, help_text="A later deadline (RFC 3339) replacing the current one."
    )
    reason = _reason()
    expected_version = _expected_version()


class ForkWarningSerializer(serializers.Serializer):
    idempotency_key = serializers.CharField()
    action = serializers.CharField()
    target = serializers.CharField()
    status = serializers.CharField()
    provider_operation_id = serializers.CharField(allow_null=True)
    detail = serializers.CharField()


class ForkResultSerializer(RunSerializer):
    warnings = serializers.SerializerMethodField()
    unread_inputs = serializers.SerializerMethodField()

    class Meta(RunSerializer.Meta):
        fields = [*RunSerializer.Meta.fields, "warnings", "unread_inputs"]

    @extend_schema_field(ForkWarningSerializer(many=True))
    def get_warnings(self, run: object) -> list[dict]:
        return self.context.get("warnings", [])

    @extend_schema_field(serializers.ListField(child=serializers.CharField()))
    def get_unread_inputs(self, run: object) -> list[str]:
        """Changed input names no step of the workflow reads (empty when Cairn cannot tell)."""
        return self.context.get("unread_inputs", [])


class ForkPreviewSerializer(serializers.Serializer):
    from_sequence = serializers.IntegerField()
    warnings = ForkWarningSerializer(many=True)


class ActionView(CairnAPIView):
    required_permission = roles.OPERATE


class ResumeView(ActionView):
    @extend_schema(
        request=ResumeInSerializer,
        responses={200: RunSerializer, **_errors(400, 403, 404, 409)},
        summary="Resume a paused, waiting or failed run from its latest checkpoint",
        tags=["operator actions"],
    )
    def post(self, request: Request, run_id: str) -> Response:
        data = self.parsed(ResumeInSerializer)
        run = run_resume(tenant=self.tenant, run_id=run_id, actor=self.actor, **data)
        return Response(RunSerializer(run).data)


class CancelView(ActionView):
    @extend_schema(
        request=CancelInSerializer,
        responses={200: RunSerializer, **_errors(400, 403, 404, 409)},
        summary="Cancel a run (cancelling until its open operations are settled)",
        tags=["operator actions"],
    )
    def post(self, request: Request, run_id: str) -> Response:
        data = self.parsed(CancelInSerializer)
        run = run_cancel(tenant=self.tenant, run_id=run_id, actor=self.actor, **data)
        return Response(RunSerializer(run).data)


class PauseView(ActionView):
    @extend_schema(
        request=PauseInSerializer,
        responses={200: RunSerializer, **_errors(400, 403, 404, 409)},
        summary="Pause a run: nothing dispatches it until it is unpaused (a step in flight "
        "still commits)",
        tags=["operator actions"],
    )
    def post(self, request: Request, run_id: str) -> Response:
        data = self.parsed(PauseInSerializer)
        run = run_pause(tenant=self.tenant, run_id=run_id, actor=self.actor, **data)
        return Response(RunSerializer(run).data)


class UnpauseView(ActionView):
    @extend_schema(
        request=UnpauseInSerializer,
        responses={200: RunSerializer, **_errors(400, 403, 404, 409)},
        summary="Unpause a run: its held command goes out (or one is queued)",
        tags=["operator actions"],
    )
    def post(self, request: Request, run_id: str) -> Response:
        data = self.parsed(UnpauseInSerializer)
        run = run_unpause(tenant=self.tenant, run_id=run_id, actor=self.actor, **data)
        return Response(RunSerializer(run).data)


class RetryView(ActionView):
    @extend_schema(
        request=RetryInSerializer,
        responses={200: RunSerializer, **_errors(400, 403, 404, 409, 422)},
        summary="Retry a named step of the workflow",
        tags=["operator actions"],
    )
    def post(self, request: Request, run_id: str) -> Response:
        data = self.parsed(RetryInSerializer)
        run = run_retry(tenant=self.tenant, run_id=run_id, actor=self.actor, **data)
        return Response(RunSerializer(run).data)


class ForkView(ActionView):
    @extend_schema(
        request=ForkInSerializer,
        responses={201: ForkResultSerializer, **_errors(400, 403, 404, 409, 413, 422)},
        summary="Fork a new run from a checkpoint (warnings name effects that may repeat)",
        tags=["operator actions"],
    )
    def post(self, request: Request, run_id: str) -> Response:
        data = self.parsed(ForkInSerializer)
        result = run_fork(tenant=self.tenant, run_id=run_id, actor=self.actor, **data)
        body = ForkResultSerializer(
            result.run,
            context={"warnings": result.warnings, "unread_inputs": result.unread_inputs},
        ).data
        return Response(body, status=201)


class ForkPreviewView(ActionView):
    @extend_schema(
        parameters=[OpenApiParameter("from_sequence", int, required=True)],
        responses={200: ForkPreviewSerializer, **_errors(400, 403, 404, 409, 422)},
        summary="Which confirmed side effects a fork from this checkpoint may repeat",
        tags=["operator actions"],
    )
    def get(self, request: Request, run_id: str) -> Response:
        raw = request.query_params.get("from_sequence", "")
        # ASCII digits only: str.isdigit() also admits "²" (which int() refuses) and "٣".
        if not (raw.isascii() and raw.isdigit() and len(raw) <= 18) or int(raw) < 1:
            raise InvalidRequest(
                "Name the checkpoint: ?from_sequence=N (a whole number from 1).",
                fields={"from_sequence": "required"},
            )
        sequence = int(raw)
        warnings = run_fork_preview(tenant=self.tenant, run_id=run_id, from_sequence=sequence)
        return Response({"from_sequence": sequence, "warnings": warnings})


class GrantBudgetView(ActionView):
    @extend_schema(
        request=GrantBudgetInSerializer,
        responses={
            200: RunSerializer,
            **_errors(400, 403, 404),
            409: OpenApiResponse(
                ErrorSerializer,
                description="concurrent_checkpoint_write (stale expected_version), "
                "run_not_active (finished or cancelling), action_not_allowed (waiting for "
                "approval, no such limit, an earlier deadline) or lease_held: a worker is "
                "executing a step of the run right now, and a grant would make that step "
                "run again. Nothing was done; grant again when the run pauses, waits or "
                "fails.",
            ),
        },
        summary="Grant a run more budget (the only way budget is added)",
        description="Raises the run's limits by the given amounts (or extends its "
        "deadline); usage is never lowered and the status is not changed. Refused while a "
        "worker holds the run's lease (409 lease_held): the grant moves the run's version, "
        "so the step being executed could not commit and would run again, model calls "
        "included.",
        tags=["operator actions"],
    )
    def post(self, request: Request, run_id: str) -> Response:
        data = self.parsed(GrantBudgetInSerializer)
        run = run_grant_budget(tenant=self.tenant, run_id=run_id, actor=self.actor, **data)
        return Response(RunSerializer(run).data)
