"""API v1 side effects: reserve an idempotency key, list a run's operations, settle one.

Thin views over ``runtime.services.operations``; every lookup is scoped to the caller's
tenant (another tenant's run or operation is a 404).
"""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response

from api.pagination import CreatedFirst
from api.serializers import StrictSerializer
from api.views import CairnAPIView, _errors
from checkpoints.models import ExternalOperation
from runtime.services.operations import (
    operation_confirm,
    operation_fail,
    operation_get,
    operation_mark_unknown,
    operation_record_job,
    operation_reserve,
    operations_for_run,
)


class OperationReserveSerializer(StrictSerializer):
    idempotency_key = serializers.CharField(max_length=200)
    action = serializers.CharField(max_length=100)
    target = serializers.CharField(max_length=500)
    request_fingerprint = serializers.CharField(max_length=128)
    step = serializers.CharField(max_length=100, required=False, default="", allow_blank=True)
    client_reference = serializers.CharField(
        max_length=200, required=False, default="", allow_blank=True
    )


class OperationConfirmSerializer(StrictSerializer):
    provider_operation_id = serializers.CharField(max_length=200)
    result = serializers.JSONField(required=False, default=dict)
    reason = serializers.CharField(max_length=2000, required=False, default="", allow_blank=True)


class OperationFailSerializer(StrictSerializer):
    reason = serializers.CharField(max_length=2000)


class OperationUnknownSerializer(StrictSerializer):
    reason = serializers.CharField(max_length=2000, required=False, default="", allow_blank=True)


class OperationJobSerializer(StrictSerializer):
    job_id = serializers.CharField(max_length=200, trim_whitespace=False)


class OperationSerializer(serializers.ModelSerializer):
    class Meta:
        model = ExternalOperation
        fields = [
            "idempotency_key",
            "action",
            "target",
            "step",
            "status",
            "request_fingerprint",
            "provider",
            "client_reference",
            "provider_operation_id",
            "provider_job_id",
            "reason",
            "attempts",
            "created_at",
            "updated_at",
        ]


class OperationListView(CairnAPIView):
    pagination_class = CreatedFirst

    @extend_schema(
        responses={200: OperationSerializer(many=True), **_errors(404)},
        summary="The run's external operations, oldest first",
    )
    def get(self, request: Request, run_id: str) -> Response:
        return self.page_response(
            operations_for_run(tenant=self.tenant, run_id=run_id), OperationSerializer
        )

    @extend_schema(
        request=OperationReserveSerializer,
        responses={
            201: OperationSerializer,
            200: OperationSerializer,
            **_errors(400, 404, 409, 422),
        },
        summary="Reserve an idempotency key (200 with the existing record for the same request)",
    )
    def post(self, request: Request, run_id: str) -> Response:
        data = self.parsed(OperationReserveSerializer)
        operation, created = operation_reserve(
            tenant=self.tenant, run_id=run_id, actor=self.actor, **data
        )
        return Response(OperationSerializer(operation).data, status=201 if created else 200)


class OperationDetailView(CairnAPIView):
    @extend_schema(responses={200: OperationSerializer, **_errors(404)}, summary="One operation")
    def get(self, request: Request, run_id: str, key: str) -> Response:
        operation = operation_get(tenant=self.tenant, run_id=run_id, idempotency_key=key)
        return Response(OperationSerializer(operation).data)


class OperationConfirmView(CairnAPIView):
    @extend_schema(
        request=OperationConfirmSerializer,
        responses={200: OperationSerializer, **_errors(400, 404, 409, 422)},
        summary="Record the provider's confirmation (id and result)",
    )
    def post(self, request: Request, run_id: str, key: str) -> Response:
        data = self.parsed(OperationConfirmSerializer)
        operation = operation_get(tenant=self.tenant, run_id=run_id, idempotency_key=key)
        operation = operation_confirm(operation_id=operation.id, actor=self.actor, **data)
        return Response(OperationSerializer(operation).data)


class OperationFailView(CairnAPIView):
    @extend_schema(
        request=OperationFailSerializer,
        responses={200: OperationSerializer, **_errors(400, 404, 409)},
        summary="Record that the provider did not and will not perform it",
    )
    def post(self, request: Request, run_id: str, key: str) -> Response:
        data = self.parsed(OperationFailSerializer)
        operation = operation_get(tenant=self.tenant, run_id=run_id, idempotency_key=key)
        operation = operation_fail(operation_id=operation.id, actor=self.actor, **data)
        return Response(OperationSerializer(operation).data)


class OperationUnknownView(CairnAPIView):
    @extend_schema(
        request=OperationUnknownSerializer,
        responses={200: OperationSerializer, **_errors(400, 404, 409)},
        summary="Record that the outcome is not known (to be reconciled)",
    )
    def post(self, request: Request, run_id: str, key: str) -> Response:
        data = self.parsed(OperationUnknownSerializer, data=request.data or {})
        operation = operation_get(tenant=self.tenant, run_id=run_id, idempotency_key=key)
        operation = operation_mark_unknown(operation_id=operation.id, actor=self.actor, **data)
        return Response(OperationSerializer(operation).data)


class OperationJobView(CairnAPIView):
    @extend_schema(
        request=OperationJobSerializer,
        responses={200: OperationSerializer, **_errors(400, 404, 409, 422)},
        summary="Record the provider's job id of a long-running operation, before polling it",
    )
    def put(self, request: Request, run_id: str, key: str) -> Response:
        # Existence first: another tenant's operation is a 404 whatever the body says.
        operation = operation_get(tenant=self.tenant, run_id=run_id, idempotency_key=key)
        data = self.parsed(OperationJobSerializer)
        operation = operation_record_job(
            operation_id=operation.id, job_id=data["job_id"], actor=self.actor
        )
        return Response(OperationSerializer(operation).data)
