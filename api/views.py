"""API v1 views: parse, call a service, render. Every lookup is scoped to the caller's tenant."""

from __future__ import annotations

from django.conf import settings
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import status
from rest_framework.parsers import BaseParser
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from api import commit_route
from api import serializers as s
from api.pagination import OldestFirst, Pagination
from api.parsers import read_limited
from cairn.errors import InvalidRequest
from checkpoints.models import Checkpoint, RunStatus
from checkpoints.selectors import checkpoint_read, runs_for_tenant
from checkpoints.services.artifacts import artifact_get, artifact_read, artifact_store
from checkpoints.services.checkpoints import checkpoint_commit_by_runner
from checkpoints.services.integrity import checkpoints_columns_verify, run_verify
from checkpoints.services.reads import run_get
from checkpoints.services.workflows import workflow_register, workflows_visible
from runtime.services.leases import lease_acquire, lease_release
from runtime.services.runs import budget_with_defaults, run_create
from tenants import roles
from tenants.models import Tenant
from tenants.selectors import request_tenant
from tenants.services import Actor


def _errors(*codes: int) -> dict[int, OpenApiResponse]:
    return {code: OpenApiResponse(s.ErrorSerializer) for code in codes}


class CairnAPIView(APIView):
    required_permission = roles.OPERATE

    @property
    def tenant(self) -> Tenant:
        return request_tenant(self.request._request)

    @property
    def actor(self) -> Actor:
        request = self.request
        token = request.auth if hasattr(request.auth, "tenant_id") else None
        return Actor(
            user=request.user,
            ip=request.META.get("REMOTE_ADDR"),
            token_id=token.pk if token else None,
        )

    def page_response(
        self, queryset: QuerySet, serializer_class: type, paginator: Pagination | None = None
    ) -> Response:
        """One page of ``queryset`` by the view's ``pagination_class`` (which the OpenAPI
        document describes) or ``paginator``."""
        paginator = paginator or self.pagination_class()
        page = paginator.paginate_queryset(queryset, self.request, view=self)
        return paginator.get_paginated_response(serializer_class(page, many=True).data)

    def parsed(self, serializer_class: type, data: object = None) -> dict:
        serializer = serializer_class(data=self.request.data if data is None else data)
        serializer.is_valid(raise_exception=True)
        return serializer.validated_data


# --- workflows ---------------------------------------------------------------------------
class WorkflowVersionView(CairnAPIView):
    @extend_schema(
        request=s.WorkflowDefinitionInSerializer,
        responses={201: s.WorkflowSerializer, 200: s.WorkflowSerializer, **_errors(400, 409, 422)},
        summary="Register a declarative workflow definition",
    )
    def put(self, request: Request, workflow_type: str, version: str) -> Response:
        if not isinstance(request.data, dict):
            raise InvalidRequest("The body must be a JSON object.")
        row, created = workflow_register(
            tenant=self.tenant,
            workflow_type=workflow_type,
            version=version,
            definition=request.data,
        )
        return Response(s.WorkflowSerializer(row).data, status=201 if created else 200)


class WorkflowListView(CairnAPIView):
    pagination_class = Pagination

    @extend_schema(responses={200: s.WorkflowSerializer(many=True)}, summary="List workflows")
    def get(self, request: Request) -> Response:
        return self.page_response(workflows_visible(tenant=self.tenant), s.WorkflowSerializer)


# --- runs --------------------------------------------------------------------------------
PAUSED_VALUES = {"true": True, "1": True, "false": False, "0": False}


class RunListView(CairnAPIView):
    pagination_class = Pagination

    @extend_schema(
        parameters=[
            OpenApiParameter("status", str, enum=RunStatus.values),
            OpenApiParameter("state", str),
            OpenApiParameter("workflow_type", str),
            OpenApiParameter("paused", bool, description="Only paused (true) or unpaused runs."),
        ],
        responses={200: s.RunSerializer(many=True), **_errors(400)},
        summary="List runs",
    )
    def get(self, request: Request) -> Response:
        params = request.query_params
        paused = PAUSED_VALUES.get(params.get("paused", ""), "bad")
        if "paused" in params and paused == "bad":
            raise InvalidRequest("paused is true or false.", fields={"paused": "true or false"})
        if "status" in params and params["status"] not in RunStatus.values:
            raise InvalidRequest(
                f"Unknown status '{params['status']}'.", fields={"status": "not a run status"}
            )
        runs = runs_for_tenant(
            self.tenant,
            status=params.get("status") or None,
            state=params.get("state") or None,
            workflow_type=params.get("workflow_type") or None,
            paused=paused if "paused" in params else None,
        )
        return self.page_response(runs, s.RunSerializer)

    @extend_schema(
        request=s.RunCreateSerializer,
        responses={201: s.RunSerializer, **_errors(400, 413, 422)},
        summary="Start a run",
    )
    def post(self, request: Request) -> Response:
        data = self.parsed(s.RunCreateSerializer)
        run = run_create(
            tenant=self.tenant,
            workflow_type=data["workflow_type"],
            workflow_version=data.get("workflow_version"),
            inputs=data["inputs"],
            objective_ref=data["objective_ref"],
            budget=budget_with_defaults(data.get("budget")),
            execution=data.get("execution"),
            actor=self.actor,
        )
        return Response(s.RunSerializer(run).data, status=201)


class RunDetailView(CairnAPIView):
    @extend_schema(responses={200: s.RunSerializer, **_errors(404)}, summary="One run")
    def get(self, request: Request, run_id: str) -> Response:
        return Response(s.RunSerializer(run_get(tenant=self.tenant, run_id=run_id)).data)


# --- checkpoints -------------------------------------------------------------------------
class CheckpointListView(CairnAPIView):
    pagination_class = OldestFirst

    def dispatch(self, request: HttpRequest, *args: object, **kwargs: object) -> HttpResponse:
        # A runner's plain commit takes the short path (api.commit_route); everything else,
        # every refusal before the commit included, is DRF's view below.
        if request.method == "POST":
            answer = commit_route.commit_answer(self, request, run_id=kwargs["run_id"])
            if answer is not None:
                return answer
        return super().dispatch(request, *args, **kwargs)

    @extend_schema(
        responses={200: s.CheckpointSerializer(many=True), **_errors(404, 409)},
        summary="Checkpoint history, oldest first",
    )
    def get(self, request: Request, run_id: str) -> Response:
        run = run_get(tenant=self.tenant, run_id=run_id)
        paginator = self.pagination_class()
        page = paginator.paginate_queryset(Checkpoint.objects.filter(run=run), request, view=self)
        # The state and step shown are the sealed ones, or the page is an integrity failure.
        checkpoints_columns_verify(page)
        return paginator.get_paginated_response(s.CheckpointSerializer(page, many=True).data)

    @extend_schema(
        request=s.CheckpointCommitSerializer,
        responses={201: s.CommitResultSerializer, **_errors(400, 404, 409, 413, 422)},
        summary="Commit the next checkpoint",
        description="Checked against the run's workflow definition for every writer; a "
        "refusal writes nothing. 409: concurrent_checkpoint_write, run_not_active, "
        "lease_held (another holds the lease; or a worker run, whose checkpoints only the "
        "holder of its lease writes), integrity_failure, budget_exhausted (usage over a "
        "limit), approval_required (entering a state past an approval state without a "
        "granted approval of its declared action, whatever the status), "
        "approval_stale, approval_expired, approval_closed, artifact_hash_mismatch. "
        "422: illegal_transition (an undeclared move; succeeded outside a terminal state; a "
        "terminal state that does not end the run), invalid_envelope, secret_in_envelope, "
        "artifact_hash_mismatch.",
    )
    def post(self, request: Request, run_id: str) -> Response:
        data = self.parsed(s.CheckpointCommitSerializer)
        result = checkpoint_commit_by_runner(
            tenant=self.tenant,
            run_id=run_id,
            expected_version=data["expected_version"],
            state=data["state"],
            step=data["step"],
            envelope=data["envelope"],
            status=data.get("status"),
            status_reason=data["status_reason"],
            lease_owner=data.get("lease_owner"),
            code_version=data["code_version"],
            actor=self.actor,
        )
        return Response(s.CommitResultSerializer(result).data, status=201)


class CheckpointDetailView(CairnAPIView):
    @extend_schema(
        responses={200: s.CheckpointDetailSerializer, **_errors(404, 409)},
        summary="One checkpoint with its decrypted envelope (audited)",
    )
    def get(self, request: Request, run_id: str, sequence: int) -> Response:
        checkpoint, envelope = checkpoint_read(
            tenant=self.tenant, run_id=run_id, sequence=sequence, actor=self.actor
        )
        return Response(
            s.CheckpointDetailSerializer(checkpoint, context={"envelope": envelope}).data
        )


class RunVerifyView(CairnAPIView):
    @extend_schema(
        responses={200: s.VerifySerializer, **_errors(404)}, summary="Verify the hash chain"
    )
    def get(self, request: Request, run_id: str) -> Response:
        return Response(run_verify(tenant=self.tenant, run_id=run_id))


# --- artifacts ---------------------------------------------------------------------------
class RawBytesParser(BaseParser):
    """Accepts any media type; the view reads the body itself, within the artifact limit."""

    media_type = "*/*"

    def parse(self, stream, media_type=None, parser_context=None):  # noqa: ANN001, ANN201
        return stream


class ArtifactCreateView(CairnAPIView):
    parser_classes = [RawBytesParser]

    @extend_schema(
        request={"application/octet-stream": OpenApiTypes.BINARY},
        parameters=[
            OpenApiParameter(
                "X-Artifact-Kind",
                str,
                OpenApiParameter.HEADER,
                enum=["source", "draft", "model_context", "tool_result", "other"],
            )
        ],
        responses={
            201: s.ArtifactSerializer,
            200: s.ArtifactSerializer,
            **_errors(400, 413),
            503: OpenApiResponse(
                s.ErrorSerializer,
                description="The database (database_unavailable) or the artifact storage "
                "(storage_unavailable: a full or read-only disk, an unreachable bucket) cannot "
                "take the write; nothing was stored. Retry-After says when to send it again.",
            ),
        },
        summary="Store an artifact (content-addressed)",
    )
    def post(self, request: Request) -> Response:
        try:
            declared = int(request.META.get("CONTENT_LENGTH") or 0) or None
        except ValueError:
            declared = None
        data = read_limited(request._request, settings.CAIRN_MAX_ARTIFACT_BYTES, declared)
        artifact, created = artifact_store(
            tenant=self.tenant,
            data=data,
            media_type=request.content_type.split(";")[0].strip() or "application/octet-stream",
            kind=request.headers.get("X-Artifact-Kind", "other"),
            uploaded_by=self.actor.user,
        )
        return Response(s.ArtifactSerializer(artifact).data, status=201 if created else 200)


class ArtifactDetailView(CairnAPIView):
    @extend_schema(
        responses={200: s.ArtifactSerializer, **_errors(404)}, summary="Artifact metadata"
    )
    def get(self, request: Request, artifact_id: str) -> Response:
        return Response(
            s.ArtifactSerializer(artifact_get(tenant=self.tenant, artifact_id=artifact_id)).data
        )


class ArtifactContentView(CairnAPIView):
    @extend_schema(
        responses={(200, "application/octet-stream"): OpenApiTypes.BINARY, **_errors(404, 409)},
        summary="Artifact bytes (decrypted; audited)",
    )
    def get(self, request: Request, artifact_id: str) -> HttpResponse:
        artifact, data = artifact_read(
            tenant=self.tenant, artifact_id=artifact_id, actor=self.actor
        )
        response = HttpResponse(data, content_type="application/octet-stream")
        response["X-Artifact-Media-Type"] = artifact.media_type
        response["X-Artifact-Sha256"] = artifact.sha256
        response["Content-Disposition"] = f'attachment; filename="{artifact.id}"'
        return response


# --- leases --------------------------------------------------------------------------------
class LeaseView(CairnAPIView):
    @extend_schema(
        request=s.LeaseInSerializer,
        responses={200: s.LeaseSerializer, **_errors(400, 404, 409)},
        summary="Acquire or renew the run's lease",
    )
    def post(self, request: Request, run_id: str) -> Response:
        data = self.parsed(s.LeaseInSerializer)
        lease = lease_acquire(
            tenant=self.tenant,
            run_id=run_id,
            owner=data["owner"],
            ttl_seconds=data["ttl_seconds"],
            expected_version=data["expected_version"],
        )
        return Response(s.LeaseSerializer(lease).data)

    @extend_schema(
        parameters=[OpenApiParameter("owner", str, required=True)],
        responses={204: None, **_errors(400, 404)},
        summary="Release the run's lease",
    )
    def delete(self, request: Request, run_id: str) -> Response:
        owner = request.query_params.get("owner", "")
        if not owner:
            raise InvalidRequest("Name the lease owner: ?owner=NAME.", fields={"owner": "required"})
        lease_release(tenant=self.tenant, run_id=run_id, owner=owner)
        return Response(status=status.HTTP_204_NO_CONTENT)
