"""API v1 for runners in any language: long-poll for the next command, and the tenant's
signed webhook. Thin views over ``runtime.services.runner`` and ``.webhooks``."""

from __future__ import annotations

from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response

from api.serializers import StrictSerializer
from api.views import CairnAPIView, _errors
from cairn.errors import InvalidRequest
from checkpoints.models import RunnerWebhook
from runtime.services.runner import MAX_WAIT_SECONDS, run_wait_next
from runtime.services.webhooks import webhook_remove, webhook_set
from tenants import roles


class NextCommandSerializer(serializers.Serializer):
    run_id = serializers.UUIDField()
    version = serializers.IntegerField()
    status = serializers.CharField()
    state = serializers.CharField()
    due = serializers.BooleanField()
    command = serializers.ChoiceField(
        choices=["step", "approval_decided", "retry", "finished", "stop", "wait"]
    )
    reason = serializers.CharField(allow_blank=True)
    approval_request_id = serializers.UUIDField(allow_null=True)


class RunNextView(CairnAPIView):
    @extend_schema(
        parameters=[
            OpenApiParameter(
                "wait",
                int,
                description=f"seconds to wait for the next command (0-{MAX_WAIT_SECONDS})",
            )
        ],
        responses={200: NextCommandSerializer, **_errors(400, 404)},
        summary="Long-poll: the run's next command, as soon as it is due",
    )
    def get(self, request: Request, run_id: str) -> Response:
        raw = request.query_params.get("wait", "0")
        if not raw.isdigit() or len(raw) > 3:
            raise InvalidRequest(
                f"wait is a whole number of seconds from 0 to {MAX_WAIT_SECONDS}.",
                fields={"wait": f"0-{MAX_WAIT_SECONDS}"},
            )
        answer = run_wait_next(tenant=self.tenant, run_id=run_id, wait_seconds=int(raw))
        return Response(answer.as_dict())


class WebhookInSerializer(StrictSerializer):
    url = serializers.CharField(max_length=500)
    secret_ref = serializers.CharField(max_length=200)


class WebhookSerializer(serializers.ModelSerializer):
    class Meta:
        model = RunnerWebhook
        fields = ["url", "secret_ref", "updated_at"]


class WebhookView(CairnAPIView):
    required_permission = roles.ADMIN

    @extend_schema(
        responses={200: WebhookSerializer}, summary="The runner webhook (url null: none is set)"
    )
    def get(self, request: Request) -> Response:
        webhook = RunnerWebhook.objects.filter(tenant=self.tenant).first()
        if webhook is None:
            return Response({"url": None, "secret_ref": None, "updated_at": None})
        return Response(WebhookSerializer(webhook).data)

    @extend_schema(
        request=WebhookInSerializer,
        responses={200: WebhookSerializer, **_errors(400)},
        summary="Set the runner webhook (signed with HMAC-SHA256 under secret_ref's secret)",
    )
    def put(self, request: Request) -> Response:
        data = self.parsed(WebhookInSerializer)
        webhook = webhook_set(tenant=self.tenant, actor=self.actor, **data)
        return Response(WebhookSerializer(webhook).data)

    @extend_schema(responses={204: None}, summary="Stop delivering webhooks (idempotent)")
    def delete(self, request: Request) -> Response:
        webhook_remove(tenant=self.tenant, actor=self.actor)
        return Response(status=204)
