"""API v1 for runners in any language: long-poll for the next command, and the tenant's
signed webhook. Thin views over ``runtime.services.runner`` and ``.webhooks``."""

from __future__ import annotations

from django.utils import timezone
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response

from api.serializers import ErrorSerializer, StrictSerializer
from api.views import CairnAPIView, _errors
from cairn.errors import InvalidRequest
from checkpoints.models import RunnerWebhook
from runtime.services.runner import (
    MAX_WAIT_SECONDS,
    WaitHandoff,
    run_wait_begin,
    run_wait_next,
)
from runtime.services.webhooks import (
    DEFAULT_OVERLAP_SECONDS,
    MAX_OVERLAP_SECONDS,
    WebhookChange,
    webhook_remove,
    webhook_secret_rotate,
    webhook_set,
    webhook_url_shown,
)
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
        responses={
            200: NextCommandSerializer,
            **_errors(400, 404),
            429: OpenApiResponse(
                ErrorSerializer,
                description="too_many_waits: the tenant already holds CAIRN_WAITS_PER_TENANT "
                "waits on this web process; nothing waited. Retry-After says when to ask again.",
            ),
        },
        summary="Long-poll: the run's next command, as soon as it is due",
        description="Sleeps until the run changes (a notification from the change's "
        "transaction) or a retry comes due, then answers. A wait holds no server thread "
        "while it sleeps; each tenant may hold a limited number at once per web process "
        "(429 past it).",
    )
    def get(self, request: Request, run_id: str) -> Response:
        raw = request.query_params.get("wait", "0")
        if not raw.isdigit() or len(raw) > 3:
            raise InvalidRequest(
                f"wait is a whole number of seconds from 0 to {MAX_WAIT_SECONDS}.",
                fields={"wait": f"0-{MAX_WAIT_SECONDS}"},
            )
        handoff = WaitHandoff.of(request.META)
        if handoff is None:  # not served by cairn.asgi: the wait sleeps in this thread
            answer = run_wait_next(tenant=self.tenant, run_id=run_id, wait_seconds=int(raw))
            return Response(answer.as_dict())
        # cairn.asgi sleeps on the wait (holding no thread), then asks again with wait=0.
        wait = run_wait_begin(tenant=self.tenant, run_id=run_id, wait_seconds=int(raw))
        handoff.take(wait)
        return Response(wait.answer.as_dict())


class WebhookInSerializer(StrictSerializer):
    url = serializers.CharField(max_length=500)
    secret_ref = serializers.CharField(max_length=200, required=False)


class WebhookRotateSerializer(StrictSerializer):
    overlap_seconds = serializers.IntegerField(
        min_value=0, max_value=MAX_OVERLAP_SECONDS, required=False, default=DEFAULT_OVERLAP_SECONDS
    )


class WebhookSerializer(serializers.Serializer):
    """The webhook; every field null when none is set. ``secret`` is the signing secret
    Cairn just generated, shown in this one answer only (null otherwise)."""

    url = serializers.CharField(allow_null=True)
    signing = serializers.ChoiceField(choices=["generated", "reference"], allow_null=True)
    secret_ref = serializers.CharField(allow_null=True)
    secret = serializers.CharField(allow_null=True)
    secret_created_at = serializers.DateTimeField(allow_null=True)
    previous_secret_expires_at = serializers.DateTimeField(allow_null=True)
    updated_at = serializers.DateTimeField(allow_null=True)


def _webhook_data(change: WebhookChange | None) -> dict:
    webhook = change.webhook if change is not None else None
    if webhook is None:
        return dict.fromkeys(WebhookSerializer().fields)
    now = timezone.now()
    overlap = webhook.previous_secret_expires_at
    return WebhookSerializer(
        {
            "url": webhook_url_shown(webhook),
            "signing": "reference" if webhook.secret_ref else "generated",
            "secret_ref": webhook.secret_ref or None,
            "secret": change.secret,
            "secret_created_at": webhook.secret_created_at,
            "previous_secret_expires_at": overlap if overlap and overlap > now else None,
            "updated_at": webhook.updated_at,
        }
    ).data


class WebhookView(CairnAPIView):
    required_permission = roles.ADMIN

    @extend_schema(
        responses={200: WebhookSerializer}, summary="The runner webhook (url null: none is set)"
    )
    def get(self, request: Request) -> Response:
        webhook = RunnerWebhook.objects.filter(tenant=self.tenant).first()
        return Response(_webhook_data(WebhookChange(webhook) if webhook else None))

    @extend_schema(
        request=WebhookInSerializer,
        responses={200: WebhookSerializer, **_errors(400)},
        summary="Set the runner webhook (Standard Webhooks signatures; the generated secret "
        "is shown once)",
    )
    def put(self, request: Request) -> Response:
        data = self.parsed(WebhookInSerializer)
        change = webhook_set(tenant=self.tenant, actor=self.actor, **data)
        response = Response(_webhook_data(change))
        response["Cache-Control"] = "no-store"
        return response

    @extend_schema(responses={204: None}, summary="Stop delivering webhooks (idempotent)")
    def delete(self, request: Request) -> Response:
        webhook_remove(tenant=self.tenant, actor=self.actor)
        return Response(status=204)


class WebhookSecretView(CairnAPIView):
    required_permission = roles.ADMIN

    @extend_schema(
        request=WebhookRotateSerializer,
        responses={200: WebhookSerializer, **_errors(400, 404)},
        summary="Rotate the webhook's signing secret (the new one is shown once; the old one "
        "keeps signing for overlap_seconds)",
    )
    def post(self, request: Request) -> Response:
        data = self.parsed(WebhookRotateSerializer)
        change = webhook_secret_rotate(tenant=self.tenant, actor=self.actor, **data)
        response = Response(_webhook_data(change))
        response["Cache-Control"] = "no-store"
        return response
