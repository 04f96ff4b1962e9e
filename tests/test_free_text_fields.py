"""Every stored free-text field is scanned for credentials before it is written (one
mechanism: ``cairn.credentials``), or is not free text. The first test enumerates every
text and JSON column of Cairn's models: a new one fails it until it is classified here.
The second writes a credential into each free-text field through its writer (the API, as a
client would) and sees 422 ``secret_in_envelope`` and nothing stored."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta

import pytest
from django.apps import apps
from django.db import models
from django.utils import timezone

from approvals.models import ApprovalDecision, ApprovalRequest, Delegation
from checkpoints.models import BulkAction, ExternalOperation, Run, WorkflowDefinition
from runtime.services.operations import operation_reserve
from tenants.models import ApiToken, AuditEvent
from tenants.services import Actor, token_issue
from tests.approvals_support import ask, at_review, draft
from tests.factories import SIMPLE_DEFINITION

pytestmark = pytest.mark.django_db
# Built from pieces so no scanner mistakes this file for a leak.
SECRET = "sk-" + "proj-" + "a1B2c3D4e5F6g7H8i9J0kLmN"
APPS = {"tenants", "telemetry", "checkpoints", "runtime", "langgraph_store", "approvals",
        "retention", "observability", "scheduling", "console", "api"}  # fmt: skip

# Not free text: what Cairn computes or composes, names checked against a definition,
# choices, sealed ciphertext, identifiers validated as such.
NOT_FREE_TEXT = {
    "tenants.Tenant.slug": "a slug, validated",
    "tenants.Tenant.name": "set on the host by create_tenant",
    "tenants.ApiToken.prefix": "the first characters of a token, never the rest",
    "tenants.ApiToken.key_sha256": "a hash",
    "tenants.AuditEvent.actor_label": "a username or a worker's id",
    "tenants.AuditEvent.action": "an event name Cairn chooses",
    "tenants.AuditEvent.target": "composed by Cairn from ids, names and checked URLs",
    "tenants.AuditEvent.details": "composed by Cairn from values each writer checked",
    "tenants.LoginThrottle.key": "a hash",
    "tenants.MemberInvitation.username": "a username, validated",
    "tenants.MemberInvitation.email": "an email address, validated",
    "tenants.MemberInvitation.role": "a role name",
    "tenants.MemberInvitation.token_sha256": "a hash",
    "tenants.TenantSecretReference.reference": "a reference (env:NAME), registered on the host",
    "telemetry.MetricTotal.name": "a metric name Cairn chooses",
    "telemetry.MetricTotal.labels": "labels Cairn composes",
    "telemetry.MetricIncrement.name": "a metric name Cairn chooses",
    "telemetry.MetricIncrement.labels": "labels Cairn composes",
    "checkpoints.WorkflowDefinition.workflow_type": "a name, validated",
    "checkpoints.WorkflowDefinition.version": "a name, validated",
    "checkpoints.WorkflowDefinition.definition_sha256": "a hash",
    "checkpoints.Run.workflow_type": "a registered workflow's name",
    "checkpoints.Run.workflow_version": "a registered workflow's version",
    "checkpoints.Run.state": "a state of the run's definition",
    "checkpoints.Run.step": "a step of the run's definition",
    "checkpoints.Run.latest_checkpoint_sha256": "a hash",
    "checkpoints.Run.trace_context": "a W3C traceparent Cairn formats from hex ids",
    "checkpoints.Run.budget_limits": "numbers and a date",
    "checkpoints.Run.budget_used": "numbers",
    "checkpoints.Checkpoint.state": "a state of the run's definition",
    "checkpoints.Checkpoint.step": "a step of the run's definition",
    "checkpoints.Checkpoint.envelope_sealed": "sealed (and scanned as an envelope)",
    "checkpoints.Checkpoint.attempt": (
        "composed by the worker: numbers, times, the step and exception class names, the "
        "model's name, artifact ids; the message, traceback, prompt and response are "
        "encrypted artifacts"
    ),
    "checkpoints.Checkpoint.key_id": "a key id",
    "checkpoints.Checkpoint.sha256": "a hash",
    "checkpoints.Checkpoint.parent_sha256": "a hash",
    "checkpoints.Checkpoint.actor": "a username or a worker's id",
    "checkpoints.Artifact.sha256": "a hash",
    "checkpoints.Artifact.media_type": "a media type",
    "checkpoints.Artifact.storage_name": "a content address",
    "checkpoints.Artifact.key_id": "a key id",
    "checkpoints.ExternalOperation.provider": "an adapter's registered name",
    "checkpoints.ExternalOperation.request_sealed": "sealed (and scanned as a request)",
    "checkpoints.ExternalOperation.result_sealed": "sealed (and scanned as a result)",
    "checkpoints.OutboxMessage.kind": "an event name Cairn chooses",
    "checkpoints.BulkAction.action": "one of the bulk actions' names",
    "checkpoints.BulkAction.actor_label": "a username",
    "checkpoints.BulkAction.step": "a step name, checked by each run's retry",
    "checkpoints.BulkActionRun.detail": "a refusal's sentence a service composed",
    "checkpoints.OutboxMessage.payload": "ids, versions and keys Cairn composes",
    "approvals.NotificationPreference.chat_url_sealed": "sealed",
    "approvals.ApprovalNotification.event": "an event name Cairn chooses",
    "approvals.ApprovalNotification.last_error": "composed by Cairn from a send's failure",
    "approvals.ApprovalRequest.reviewer_role": "a role name the definition's normal form checked",
    "approvals.ApprovalRequest.reviewer_group": "a group name the definition's normal form checked",
    "tenants.ReviewerGroup.name": "a slug, validated",
    "checkpoints.RunnerWebhook.secret_ref": "a registered reference",
    "checkpoints.RunnerWebhook.url_sealed": "sealed",
    "checkpoints.RunnerWebhook.secret_sealed": "sealed",
    "checkpoints.RunnerWebhook.previous_secret_sealed": "sealed",
    "checkpoints.WebhookDelivery.last_error": "composed by Cairn (a status, a refusal)",
    "checkpoints.WebhookDelivery.body": "made from the outbox row",
    "checkpoints.WorkerHeartbeat.worker_id": "a worker's id",
    "checkpoints.WorkerHeartbeat.hostname": "a host name",
    "checkpoints.CompactionRecord.policy_label": "a retention policy's label, set by admins",
    "checkpoints.CompactionRecord.removed": "hashes and positions",
    "langgraph_store.LangGraphThread.thread_id": "an id the application chooses",
    "langgraph_store.LangGraphBranch.forked_from_checkpoint_id": "an id",
    "langgraph_store.LangGraphCheckpoint.checkpoint_ns": "a namespace LangGraph names",
    "langgraph_store.LangGraphCheckpoint.checkpoint_id": "an id",
    "langgraph_store.LangGraphCheckpoint.parent_checkpoint_id": "an id",
    "langgraph_store.LangGraphCheckpoint.checkpoint_sealed": "sealed",
    "langgraph_store.LangGraphCheckpoint.metadata_sealed": "sealed",
    "langgraph_store.LangGraphCheckpoint.source": "a LangGraph source name",
    "langgraph_store.LangGraphCheckpoint.lg_run_id": "an id",
    "langgraph_store.LangGraphCheckpoint.channel_refs": "channel names and versions",
    "langgraph_store.LangGraphCheckpoint.delta_channels": "channel names",
    "langgraph_store.LangGraphBlob.checkpoint_ns": "a namespace LangGraph names",
    "langgraph_store.LangGraphBlob.channel": "a channel name",
    "langgraph_store.LangGraphBlob.version": "a channel version",
    "langgraph_store.LangGraphBlob.value_sealed": "sealed",
    "langgraph_store.LangGraphWrite.checkpoint_ns": "a namespace LangGraph names",
    "langgraph_store.LangGraphWrite.checkpoint_id": "an id",
    "langgraph_store.LangGraphWrite.task_id": "an id",
    "langgraph_store.LangGraphWrite.task_path": "a task path LangGraph names",
    "langgraph_store.LangGraphWrite.channel": "a channel name",
    "langgraph_store.LangGraphWrite.value_sealed": "sealed",
    "approvals.ApprovalRequest.checkpoint_sha256": "a hash",
    "approvals.ApprovalRequest.artifact_sha256": "a hash",
    "approvals.ApprovalRequest.edited_from_sha256": "a hash",
    "approvals.ApprovalRequest.requester_label": "a username or a worker's id",
    "approvals.ApprovalRequest.status_reason": "composed by Cairn (a rejection's scanned comment)",
    "approvals.ApprovalDecision.artifact_sha256": "a hash",
    "retention.RetentionPolicy.workflow_type": "a workflow's name",
    "retention.RetentionPolicy.updated_by": "a username",
    "retention.PendingFileDeletion.storage_name": "a content address",
    "scheduling.PeriodicJob.name": "a job name Cairn chooses",
    "scheduling.PeriodicJob.holder": "a worker's id",
}


def stored_text_fields() -> set[str]:
    found = set()
    for model in apps.get_models():
        if model._meta.app_label not in APPS:
            continue
        for field in model._meta.get_fields():
            text = isinstance(field, models.CharField | models.TextField | models.JSONField)
            if text and not field.choices:
                found.add(f"{model._meta.label}.{field.name}")
    return found


@pytest.fixture
def world(api_as, acme, alice, bob, carol, run):  # noqa: ANN001
    """The cast's API clients, the external run at its approval state with a pending
    request, and one reserved operation."""
    artifact = draft(acme)
    at_review(run, artifact)
    request = ask(run, artifact, bob)
    operation, _ = operation_reserve(
        tenant=acme,
        run_id=run.id,
        idempotency_key="k-1",
        action="publish",
        target="t",
        request_fingerprint="f",
        actor=Actor.system("t"),
    )
    run.refresh_from_db()
    return {
        "bob": api_as(bob, acme),
        "carol": api_as(carol, acme),
        "alice": api_as(alice, acme),
        "run": run,
        "artifact": artifact,
        "request": request,
        "operation": operation,
        "acme": acme,
        "bob_user": bob,
    }


def _post(client, path: str, body: dict):  # noqa: ANN001, ANN202
    return client.post(path, body, format="json")


def _ops(w: dict) -> str:
    return f"/api/v1/runs/{w['run'].id}/operations"


def _reserve(field: str) -> Callable[[dict], object]:
    def write(w: dict):  # noqa: ANN202
        body = {
            "idempotency_key": "k-2",
            "action": "publish",
            "target": "t",
            "request_fingerprint": "f",
            field: SECRET,
        }
        return _post(w["bob"], _ops(w), body)

    return write


def _token_label(w: dict) -> object:
    from cairn.errors import SecretInEnvelope

    try:
        token_issue(
            tenant=w["acme"], user=w["bob_user"], actor=Actor(user=w["bob_user"]), name=SECRET
        )
    except SecretInEnvelope as refusal:
        return refusal
    return None


# field → (a write that puts SECRET there, the rows to search for it afterwards)
FREE_TEXT: dict[str, tuple[Callable[[dict], object], Callable[[], models.QuerySet]]] = {
    "checkpoints.Run.status_reason": (
        lambda w: _post(w["bob"], f"/api/v1/runs/{w['run'].id}/actions/cancel", {"reason": SECRET}),
        lambda: Run.objects.filter(status_reason__contains=SECRET),
    ),
    "checkpoints.BulkAction.reason": (
        lambda w: _post(
            w["bob"],
            "/api/v1/bulk-actions",
            {"action": "pause", "reason": SECRET, "run_ids": [str(w["run"].id)]},
        ),
        lambda: BulkAction.objects.filter(reason__contains=SECRET),
    ),
    "checkpoints.BulkAction.selection": (
        lambda w: _post(
            w["bob"],
            "/api/v1/bulk-actions",
            {"action": "pause", "reason": "r", "filter": {"state": SECRET}},
        ),
        lambda: BulkAction.objects.filter(selection__filter__state=SECRET),
    ),
    "checkpoints.Run.pause_reason": (
        lambda w: _post(w["bob"], f"/api/v1/runs/{w['run'].id}/actions/pause", {"reason": SECRET}),
        lambda: Run.objects.filter(pause_reason__contains=SECRET),
    ),
    "tenants.AuditEvent.reason": (
        lambda w: _post(
            w["bob"],
            f"/api/v1/runs/{w['run'].id}/actions/grant_budget",
            {"attempts": 1, "reason": SECRET},
        ),
        lambda: AuditEvent.objects.filter(reason__contains=SECRET),
    ),
    "checkpoints.Run.objective_ref": (
        lambda w: _post(
            w["bob"], "/api/v1/runs", {"workflow_type": "research", "objective_ref": SECRET}
        ),
        lambda: Run.objects.filter(objective_ref__contains=SECRET),
    ),
    "checkpoints.Run.lease_owner": (
        lambda w: _post(
            w["bob"],
            f"/api/v1/runs/{w['run'].id}/lease",
            {"owner": SECRET, "ttl_seconds": 30, "expected_version": w["run"].version},
        ),
        lambda: Run.objects.filter(lease_owner__contains=SECRET),
    ),
    "checkpoints.ExternalOperation.idempotency_key": (
        _reserve("idempotency_key"),
        lambda: ExternalOperation.objects.filter(idempotency_key__contains=SECRET),
    ),
    "checkpoints.ExternalOperation.action": (
        _reserve("action"),
        lambda: ExternalOperation.objects.filter(action__contains=SECRET),
    ),
    "checkpoints.ExternalOperation.target": (
        _reserve("target"),
        lambda: ExternalOperation.objects.filter(target__contains=SECRET),
    ),
    "checkpoints.ExternalOperation.request_fingerprint": (
        _reserve("request_fingerprint"),
        lambda: ExternalOperation.objects.filter(request_fingerprint__contains=SECRET),
    ),
    "checkpoints.ExternalOperation.step": (
        _reserve("step"),
        lambda: ExternalOperation.objects.filter(step__contains=SECRET),
    ),
    "checkpoints.ExternalOperation.client_reference": (
        _reserve("client_reference"),
        lambda: ExternalOperation.objects.filter(client_reference__contains=SECRET),
    ),
    "checkpoints.ExternalOperation.provider_operation_id": (
        lambda w: _post(w["bob"], _ops(w) + "/k-1/confirm", {"provider_operation_id": SECRET}),
        lambda: ExternalOperation.objects.filter(provider_operation_id__contains=SECRET),
    ),
    "checkpoints.ExternalOperation.provider_job_id": (
        lambda w: w["bob"].put(_ops(w) + "/k-1/job", {"job_id": SECRET}, format="json"),
        lambda: ExternalOperation.objects.filter(provider_job_id__contains=SECRET),
    ),
    "checkpoints.ExternalOperation.reason": (
        lambda w: _post(w["bob"], _ops(w) + "/k-1/fail", {"reason": SECRET}),
        lambda: ExternalOperation.objects.filter(reason__contains=SECRET),
    ),
    "checkpoints.WorkflowDefinition.definition": (
        lambda w: w["bob"].put(
            "/api/v1/workflows/leaky/versions/1",
            {**SIMPLE_DEFINITION, "initial": SECRET},
            format="json",
        ),
        lambda: WorkflowDefinition.objects.filter(workflow_type="leaky"),
    ),
    "approvals.ApprovalRequest.action": (
        lambda w: _post(
            w["bob"],
            f"/api/v1/runs/{w['run'].id}/approvals",
            {
                "artifact_id": str(w["artifact"].id),
                "artifact_sha256": w["artifact"].sha256,
                "action": SECRET,
            },
        ),
        lambda: ApprovalRequest.objects.filter(action__contains=SECRET),
    ),
    "approvals.ApprovalDecision.comment": (
        lambda w: _post(
            w["carol"],
            f"/api/v1/approvals/{w['request'].id}/decision",
            {"decision": "reject", "artifact_sha256": w["artifact"].sha256, "comment": SECRET},
        ),
        lambda: ApprovalDecision.objects.filter(comment__contains=SECRET),
    ),
    "approvals.Delegation.reason": (
        lambda w: _post(
            w["carol"],
            "/api/v1/account/delegations",
            {
                "delegate": "alice",
                "ends_at": (timezone.now() + timedelta(days=1)).isoformat(),
                "reason": SECRET,
            },
        ),
        lambda: Delegation.objects.filter(reason__contains=SECRET),
    ),
    "tenants.ApiToken.name": (_token_label, lambda: ApiToken.objects.filter(name__contains=SECRET)),
}


def test_every_stored_text_field_is_scanned_or_is_not_free_text():
    fields = stored_text_fields()
    assert set(FREE_TEXT).isdisjoint(NOT_FREE_TEXT)
    unclassified = fields - set(FREE_TEXT) - set(NOT_FREE_TEXT)
    assert not unclassified, f"classify these stored text fields: {sorted(unclassified)}"
    assert not (set(FREE_TEXT) | set(NOT_FREE_TEXT)) - fields, "fields that no longer exist"


@pytest.mark.parametrize("field", sorted(FREE_TEXT))
def test_a_credential_in_a_free_text_field_is_refused_and_nothing_is_stored(world, field):  # noqa: ANN001
    write, stored = FREE_TEXT[field]
    answer = write(world)
    if hasattr(answer, "status_code"):
        assert answer.status_code == 422, (field, answer.content)
        assert answer.json()["code"] == "secret_in_envelope", answer.json()
        assert SECRET not in answer.content.decode()
    else:
        assert answer is not None, f"{field}: the writer did not refuse"
    assert not stored().exists(), field
    assert not AuditEvent.objects.filter(reason__contains=SECRET).exists()


def test_text_cairn_composed_is_withheld_not_refused(run):  # noqa: ANN001
    """A worker's failure text (an exception, a provider's answer) cannot be asked for
    again: it is stored as withheld, and the commit goes on."""
    from cairn.credentials import WITHHELD
    from checkpoints.services.checkpoints import CommitRequest, checkpoint_commit

    checkpoint_commit(
        tenant=run.tenant,
        run_id=run.id,
        request=CommitRequest(
            expected_version=run.version,
            state="draft_answer",
            envelope={},
            status_reason=f"the step failed: {SECRET}",
            actor=Actor.system("worker-1"),
        ),
    )
    run.refresh_from_db()
    assert run.status_reason == WITHHELD
