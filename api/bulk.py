"""API v1 bulk actions: POST /api/v1/bulk-actions (a dry run, or the action queued),
GET /api/v1/bulk-actions[/{id}[/refusals]]. Parse, call the service, render; the rules and
the work are ``runtime.services.bulk``'s, the runs are selected by ids or by the runs list's
own filter (``checkpoints.selectors.runs_for_tenant``)."""

from __future__ import annotations

from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response

from api.actions import ActionView, _reason
from api.pagination import Pagination
from api.serializers import ErrorSerializer, StrictSerializer
from api.views import _errors
from checkpoints.models import BulkAction, BulkActionRun, RunStatus
from checkpoints.selectors import runs_for_tenant
from runtime.services.bulk import (
    ACTIONS,
    bulk_action_get,
    bulk_action_plan,
    bulk_action_refusals,
    bulk_action_start,
    bulk_actions_of,
    bulk_selection,
)


class BulkFilterSerializer(StrictSerializer):
    """The filters of GET /api/v1/runs, as that list reads them."""

    status = serializers.ChoiceField(choices=RunStatus.values, required=False)
    state = serializers.CharField(max_length=100, required=False)
    workflow_type = serializers.CharField(max_length=100, required=False)
    paused = serializers.BooleanField(required=False, help_text="Only paused (true) or unpaused.")


class BulkActionInSerializer(StrictSerializer):
    action = serializers.ChoiceField(choices=ACTIONS)
    step = serializers.CharField(
        max_length=100, required=False, help_text="For retry: the step (or its state) to run again."
    )
    reason = _reason()
    run_ids = serializers.ListField(
        child=serializers.UUIDField(),
        required=False,
        help_text="The runs to act on (ticked); an id no run of the tenant has is refused as "
        "not found. Give run_ids or filter, not both.",
    )
    filter = BulkFilterSerializer(
        required=False, help_text="Select the runs GET /api/v1/runs lists with these filters."
    )
    dry_run = serializers.BooleanField(
        default=False,
        help_text="true: answer what would happen (the count, each refusal and its reason) "
        "and change nothing.",
    )

    def validate(self, data: dict) -> dict:
        if ("run_ids" in data) == ("filter" in data):
            raise serializers.ValidationError(
                {"run_ids": "Give run_ids or filter (exactly one of them)."}
            )
        return data


class RefusalSerializer(serializers.Serializer):
    run_id = serializers.UUIDField()
    reason = serializers.CharField()


class BulkPlanSerializer(serializers.Serializer):
    dry_run = serializers.BooleanField()
    action = serializers.CharField()
    step = serializers.CharField()
    total = serializers.IntegerField(help_text="Runs selected.")
    actionable = serializers.IntegerField(help_text="Runs the action would act on now.")
    refused = serializers.IntegerField(help_text="Runs it would refuse (see refusals).")
    refusals = RefusalSerializer(many=True)


class BulkActionSerializer(serializers.ModelSerializer):
    actor = serializers.CharField(source="actor_label")

    class Meta:
        model = BulkAction
        fields = [
            "id",
            "action",
            "step",
            "reason",
            "actor",
            "selection",
            "status",
            "total",
            "done",
            "refused",
            "created_at",
            "started_at",
            "finished_at",
        ]


class BulkRefusalSerializer(serializers.ModelSerializer):
    reason = serializers.CharField(source="detail")

    class Meta:
        model = BulkActionRun
        fields = ["run_id", "reason"]


class ByPosition(Pagination):
    """A bulk action's runs, in the order they were selected."""

    ordering = ("position",)


class BulkActionListView(ActionView):
    pagination_class = Pagination

    @extend_schema(
        responses={200: BulkActionSerializer(many=True)},
        summary="List bulk actions, newest first",
        tags=["operator actions"],
    )
    def get(self, request: Request) -> Response:
        return self.page_response(bulk_actions_of(tenant=self.tenant), BulkActionSerializer)

    @extend_schema(
        request=BulkActionInSerializer,
        responses={
            200: OpenApiResponse(BulkPlanSerializer, description="The dry run: nothing changed."),
            202: OpenApiResponse(
                BulkActionSerializer,
                description="Queued: a worker acts on each run through its action's service; "
                "follow GET /api/v1/bulk-actions/{id}.",
            ),
            400: OpenApiResponse(
                ErrorSerializer,
                description="invalid_request: no reason, an unknown action, a retry without "
                "a step, no runs selected, or more than CAIRN_BULK_ACTION_MAX_RUNS runs.",
            ),
            **_errors(403, 413, 422),
        },
        summary="Cancel, resume, retry a step of, pause or unpause many runs (or a dry run)",
        tags=["operator actions"],
    )
    def post(self, request: Request) -> Response:
        data = self.parsed(BulkActionInSerializer)
        if "filter" in data:
            given = dict(data["filter"])
            ids = bulk_selection(runs_for_tenant(self.tenant, **given))
            selection = {"filter": given}
        else:
            ids, selection = data["run_ids"], {"run_ids": len(data["run_ids"])}
        step = data.get("step", "")
        if data["dry_run"]:
            plan = bulk_action_plan(
                tenant=self.tenant, action=data["action"], run_ids=ids, step=step
            )
            body = {
                "dry_run": True,
                "action": plan.action,
                "step": plan.step,
                "total": plan.total,
                "actionable": len(plan.actionable),
                "refused": len(plan.refusals),
                "refusals": [{"run_id": pk, "reason": why} for pk, why in plan.refusals],
            }
            return Response(BulkPlanSerializer(body).data)
        bulk = bulk_action_start(
            tenant=self.tenant,
            actor=self.actor,
            action=data["action"],
            reason=data["reason"],
            run_ids=ids,
            selection=selection,
            step=step,
        )
        return Response(BulkActionSerializer(bulk).data, status=202)


class BulkActionDetailView(ActionView):
    @extend_schema(
        responses={200: BulkActionSerializer, **_errors(403, 404)},
        summary="A bulk action's progress: done, refused and total runs, and its status",
        tags=["operator actions"],
    )
    def get(self, request: Request, bulk_action_id: str) -> Response:
        bulk = bulk_action_get(tenant=self.tenant, bulk_action_id=bulk_action_id)
        return Response(BulkActionSerializer(bulk).data)


class BulkActionRefusalsView(ActionView):
    pagination_class = ByPosition

    @extend_schema(
        responses={200: BulkRefusalSerializer(many=True), **_errors(403, 404)},
        summary="The runs a bulk action refused, each with the reason its service gave",
        tags=["operator actions"],
    )
    def get(self, request: Request, bulk_action_id: str) -> Response:
        bulk = bulk_action_get(tenant=self.tenant, bulk_action_id=bulk_action_id)
        return self.page_response(bulk_action_refusals(bulk), BulkRefusalSerializer)
