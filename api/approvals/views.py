"""Approvals API v1: operators ask, reviewers decide. Thin: parse, call a service, render."""

from __future__ import annotations

from django.http import HttpResponse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework.request import Request
from rest_framework.response import Response

from api.approvals import serializers as s
from api.pagination import Pagination
from api.serializers import ErrorSerializer
from api.views import CairnAPIView, _errors
from approvals.models import ApprovalStatus
from approvals.selectors import approvals_for_run, request_get, requests_for_tenant, review_queue
from approvals.services import approval_decide, approval_request_create
from approvals.services.delegations import (
    delegation_create,
    delegation_revoke,
    delegations_of,
)
from approvals.services.evidence import run_evidence_export
from approvals.services.preferences import (
    notification_preferences_get,
    notification_preferences_set,
)
from approvals.signing import evidence_signing_key
from cairn.errors import InvalidRequest
from checkpoints.services.artifacts import artifact_read
from checkpoints.services.reads import run_get
from tenants import roles


class QueuePagination(Pagination):
    ordering = ("expires_at", "id")


def _fresh(tenant, request_id, user=None):  # noqa: ANN001, ANN202
    return request_get(tenant=tenant, request_id=request_id, user=user)


class RunApprovalsView(CairnAPIView):
    required_permission = roles.OPERATE
    pagination_class = Pagination

    @extend_schema(
        request=s.ApprovalRequestCreateSerializer,
        responses={201: s.ApprovalRequestSerializer, **_errors(400, 404, 409, 422)},
        summary="Ask for approval of an artifact, bound to the run's current version",
    )
    def post(self, request: Request, run_id: str) -> Response:
        data = self.parsed(s.ApprovalRequestCreateSerializer)
        row = approval_request_create(
            tenant=self.tenant,
            run_id=run_id,
            artifact_id=data["artifact_id"],
            artifact_sha256=data["artifact_sha256"],
            action=data["action"],
            expires_at=data.get("expires_at"),
            required_approvals=data["required_approvals"],
            actor=self.actor,
        )
        return Response(s.ApprovalRequestSerializer(_fresh(self.tenant, row.pk)).data, status=201)

    @extend_schema(
        responses={200: s.ApprovalRequestSerializer(many=True), **_errors(404)},
        summary="The run's approval requests, newest first",
    )
    def get(self, request: Request, run_id: str) -> Response:
        run = run_get(tenant=self.tenant, run_id=run_id)
        return self.page_response(
            approvals_for_run(tenant=self.tenant, run=run), s.ApprovalRequestSerializer
        )


class ApprovalListView(CairnAPIView):
    required_permission = roles.REVIEWERS
    pagination_class = Pagination

    @extend_schema(
        parameters=[
            OpenApiParameter(
                "status",
                str,
                enum=ApprovalStatus.values,
                description="pending (the default) is the caller's review queue: unexpired "
                "requests they may decide, most urgent first. Other values list the tenant's "
                "requests in that status, newest first.",
            )
        ],
        responses={200: s.ApprovalRequestSerializer(many=True), **_errors(400)},
        summary="The caller's review queue (or the tenant's requests in a status)",
    )
    def get(self, request: Request) -> Response:
        # Absent is the queue; present, even empty, must name a status (the document's enum).
        status = request.query_params.get("status", ApprovalStatus.PENDING)
        if status not in ApprovalStatus.values:
            raise InvalidRequest(
                f"Unknown approval status '{status}'.", fields={"status": "not an approval status"}
            )
        if status == ApprovalStatus.PENDING:
            rows, paginator = review_queue(tenant=self.tenant, user=request.user), QueuePagination()
        else:
            rows = requests_for_tenant(self.tenant, status=status, user=request.user)
            paginator = None
        return self.page_response(
            rows.prefetch_related("decisions__approver"), s.ApprovalRequestSerializer, paginator
        )


class ApprovalDetailView(CairnAPIView):
    required_permission = roles.REVIEWERS

    @extend_schema(
        responses={200: s.ApprovalRequestSerializer, **_errors(404)},
        summary="One approval request with its decisions",
    )
    def get(self, request: Request, approval_id: str) -> Response:
        return Response(
            s.ApprovalRequestSerializer(_fresh(self.tenant, approval_id, request.user)).data
        )


class ApprovalDecisionView(CairnAPIView):
    required_permission = roles.REVIEWERS

    @extend_schema(
        request=s.DecisionInSerializer,
        responses={
            200: s.DecisionResultSerializer,
            400: ErrorSerializer,
            403: ErrorSerializer,
            404: ErrorSerializer,
            409: ErrorSerializer,
            413: ErrorSerializer,
            422: ErrorSerializer,
        },
        description="403 permission_denied: the approval state declares reviewers (a role or "
        "a reviewer group) the caller is not among. 409 codes: approval_expired, "
        "artifact_hash_mismatch (the hash the reviewer saw is not the bound one), "
        "approval_stale (the run moved past the bound version, or a newer request replaced "
        "this one), self_approval_forbidden, "
        "already_decided, approval_closed. With edited_text (approve with edits) also: 400 "
        "invalid_request (the edit changes nothing, is empty, comes with a reject, or the "
        "artifact is not text), 413 payload_too_large (over CAIRN_MAX_ARTIFACT_BYTES), 422 "
        "secret_in_envelope (a credential in the text); the response's request is the new "
        "one, bound to the edited artifact.",
        summary="Approve (optionally with edits) or reject exactly the artifact you were shown",
    )
    def post(self, request: Request, approval_id: str) -> Response:
        data = self.parsed(s.DecisionInSerializer)
        decision = approval_decide(
            tenant=self.tenant,
            request_id=approval_id,
            decision=data["decision"],
            artifact_sha256=data["artifact_sha256"],
            comment=data["comment"],
            edited_text=data.get("edited_text"),
            actor=self.actor,
        )
        # An edit's decision is on the request it raised: the response shows that one.
        body = {
            "decision": decision,
            "request": _fresh(self.tenant, decision.request_id, request.user),
        }
        return Response(s.DecisionResultSerializer(body).data)


class ApprovalArtifactView(CairnAPIView):
    """A reviewer reads the artifact bound to a request of their tenant, and nothing else:
    the general artifact endpoints stay operator-only."""

    required_permission = roles.REVIEWERS

    @extend_schema(
        responses={(200, "application/octet-stream"): OpenApiTypes.BINARY, **_errors(404, 409)},
        summary="The bytes of the artifact under review (decrypted; audited)",
    )
    def get(self, request: Request, approval_id: str) -> HttpResponse:
        row = request_get(tenant=self.tenant, request_id=approval_id, user=request.user)
        artifact, data = artifact_read(
            tenant=self.tenant, artifact_id=row.artifact_id, actor=self.actor, run_id=row.run_id
        )
        response = HttpResponse(data, content_type="application/octet-stream")
        response["X-Artifact-Media-Type"] = artifact.media_type
        response["X-Artifact-Sha256"] = artifact.sha256
        response["Content-Disposition"] = f'attachment; filename="{artifact.id}"'
        return response


class RunEvidenceView(CairnAPIView):
    """The run's signed evidence bundle (operators and admins; audited)."""

    required_permission = roles.OPERATE

    @extend_schema(
        parameters=[
            OpenApiParameter(
                "include",
                str,
                enum=["bytes"],
                description="bytes: add each artifact's decrypted content (base64; every "
                "artifact read is audited).",
            )
        ],
        responses={(200, "application/json"): OpenApiTypes.OBJECT, **_errors(404, 409, 503)},
        summary="The run's signed evidence bundle (audited)",
        description="Canonical JSON `{payload, signature}`, signed with the deployment's "
        "Ed25519 key (GET /api/v1/evidence/public-key); verify it offline with `python -m "
        "approvals.evidence_verify bundle.json --public-key key.pem`. Save the body as it "
        "is: a single changed byte fails verification. 409 integrity_failure (an envelope or "
        "artifact that cannot be decrypted); 503 key_unavailable (no signing key).",
    )
    def get(self, request: Request, run_id: str) -> HttpResponse:
        include = request.query_params.get("include", "")
        if include not in ("", "bytes"):
            raise InvalidRequest("include takes only 'bytes'.", fields={"include": "not 'bytes'"})
        bundle = run_evidence_export(
            tenant=self.tenant, run_id=run_id, actor=self.actor, include_bytes=include == "bytes"
        )
        response = HttpResponse(bundle.data, content_type="application/json")
        response["Content-Disposition"] = f'attachment; filename="{bundle.filename}"'
        response["X-Evidence-Key-Id"] = bundle.key_id
        return response


class EvidencePublicKeyView(CairnAPIView):
    """The public half of the deployment's evidence key: anyone may fetch it."""

    authentication_classes: list = []
    permission_classes: list = []

    @extend_schema(
        responses={200: s.EvidencePublicKeySerializer, **_errors(503)},
        summary="The public key that verifies evidence bundles",
        auth=[],
    )
    def get(self, request: Request) -> Response:
        return Response(evidence_signing_key().published())


class NotificationPreferencesView(CairnAPIView):
    """The caller's own notification preferences in this tenant (anyone who may review)."""

    required_permission = roles.REVIEWERS

    @extend_schema(
        responses={200: s.NotificationPreferencesSerializer},
        summary="Your notification preferences: email, chat and the chat URL (its origin)",
    )
    def get(self, request: Request) -> Response:
        prefs = notification_preferences_get(tenant=self.tenant, user=request.user)
        return Response(s.NotificationPreferencesSerializer(prefs).data)

    @extend_schema(
        request=s.NotificationPreferencesInSerializer,
        responses={200: s.NotificationPreferencesSerializer, **_errors(400)},
        summary="Change your notification preferences (audited)",
    )
    def put(self, request: Request) -> Response:
        data = self.parsed(s.NotificationPreferencesInSerializer)
        prefs = notification_preferences_set(
            tenant=self.tenant,
            user=request.user,
            actor=self.actor,
            email=data.get("email"),
            chat=data.get("chat"),
            chat_url=data.get("chat_url"),
        )
        return Response(s.NotificationPreferencesSerializer(prefs).data)


class DelegationPagination(Pagination):
    ordering = ("ends_at", "id")


class DelegationListView(CairnAPIView):
    """The caller's delegations (given and received) that have not ended."""

    required_permission = roles.REVIEWERS
    pagination_class = DelegationPagination

    @extend_schema(
        responses={200: s.DelegationSerializer(many=True)},
        summary="Your delegations, given and received, not yet ended",
    )
    def get(self, request: Request) -> Response:
        rows = delegations_of(tenant=self.tenant, user=request.user)
        return self.page_response(rows, s.DelegationSerializer)

    @extend_schema(
        request=s.DelegationInSerializer,
        responses={201: s.DelegationSerializer, **_errors(400)},
        summary="Let another reviewer decide in your place until ends_at (audited)",
    )
    def post(self, request: Request) -> Response:
        data = self.parsed(s.DelegationInSerializer)
        row = delegation_create(
            tenant=self.tenant,
            delegate_username=data["delegate"],
            ends_at=data["ends_at"],
            starts_at=data.get("starts_at"),
            reason=data["reason"],
            actor=self.actor,
        )
        return Response(s.DelegationSerializer(row).data, status=201)


class DelegationView(CairnAPIView):
    required_permission = roles.REVIEWERS

    @extend_schema(
        responses={200: s.DelegationSerializer, **_errors(404)},
        summary="End one of your delegations now (its delegator or delegate; audited)",
    )
    def delete(self, request: Request, delegation_id: str) -> Response:
        row = delegation_revoke(tenant=self.tenant, delegation_id=delegation_id, actor=self.actor)
        return Response(s.DelegationSerializer(row).data)
