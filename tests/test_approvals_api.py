"""Approvals API v1: operators ask, reviewers decide; every refusal has its code."""

from __future__ import annotations

from datetime import timedelta

import pytest
import yaml
from django.utils import timezone

from approvals.models import ApprovalDecision, ApprovalRequest, ApprovalStatus
from checkpoints.models import RunStatus
from tenants.models import AuditEvent
from tests.approvals_support import ask, at_review, draft, expire_now, move

pytestmark = pytest.mark.django_db


@pytest.fixture
def artifact(acme):  # noqa: ANN001
    return draft(acme)


@pytest.fixture
def waiting(run, artifact):  # noqa: ANN001
    return at_review(run, artifact)


@pytest.fixture
def pending(waiting, artifact, bob):  # noqa: ANN001
    return ask(waiting, artifact, bob)


@pytest.fixture
def as_carol(api_as, carol, acme):  # noqa: ANN001
    return api_as(carol, acme)


def decision_of(api, request, decision="approve", sha=None, comment=""):  # noqa: ANN001, ANN201
    return api.post(
        f"/api/v1/approvals/{request.pk}/decision",
        {
            "decision": decision,
            "artifact_sha256": request.artifact_sha256 if sha is None else sha,
            "comment": comment,
        },
        format="json",
    )


# --- asking --------------------------------------------------------------------------------
def test_an_operator_asks_for_approval_bound_to_the_runs_current_version(
    api_as, bob, acme, waiting, artifact
):
    expires = timezone.now() + timedelta(hours=2)
    response = api_as(bob, acme).post(
        f"/api/v1/runs/{waiting.id}/approvals",
        {
            "artifact_id": str(artifact.id),
            "artifact_sha256": artifact.sha256,
            "action": "publish",
            "expires_at": expires.isoformat(),
        },
        format="json",
    )
    assert response.status_code == 201, response.content
    body = response.json()
    assert body["run_version"] == waiting.version
    assert body["checkpoint_sequence"] == waiting.checkpoint_sequence
    assert body["artifact_sha256"] == artifact.sha256 and body["artifact"]["size"] == artifact.size
    assert body["status"] == "pending" and body["requester"] == "bob"
    assert body["required_approvals"] == 1 and body["decisions"] == []


def test_a_reviewer_may_not_ask_for_approval(as_carol, waiting, artifact):
    response = as_carol.post(
        f"/api/v1/runs/{waiting.id}/approvals",
        {"artifact_id": str(artifact.id), "artifact_sha256": artifact.sha256, "action": "publish"},
        format="json",
    )
    assert response.status_code == 403
    assert not ApprovalRequest.objects.exists()


def test_asking_with_a_hash_the_artifact_does_not_have_is_422(api_as, bob, acme, waiting, artifact):
    response = api_as(bob, acme).post(
        f"/api/v1/runs/{waiting.id}/approvals",
        {"artifact_id": str(artifact.id), "artifact_sha256": "a" * 64, "action": "publish"},
        format="json",
    )
    assert response.status_code == 422
    assert response.json()["code"] == "artifact_hash_mismatch"


def test_asking_with_bad_input_is_400_never_500(api_as, bob, acme, waiting, artifact):
    api = api_as(bob, acme)
    url = f"/api/v1/runs/{waiting.id}/approvals"
    for body in (
        {},
        {"artifact_id": "nope", "artifact_sha256": artifact.sha256, "action": "publish"},
        {"artifact_id": str(artifact.id), "artifact_sha256": "XYZ", "action": "publish"},
        {
            "artifact_id": str(artifact.id),
            "artifact_sha256": artifact.sha256,
            "action": "publish",
            "surprise": 1,
        },
        {
            "artifact_id": str(artifact.id),
            "artifact_sha256": artifact.sha256,
            "action": "publish",
            "expires_at": (timezone.now() - timedelta(hours=1)).isoformat(),
        },
    ):
        response = api.post(url, body, format="json")
        assert response.status_code == 400, (body, response.content)
        assert response.json()["code"] == "invalid_request"


def test_asking_on_another_tenants_run_is_404(api_as, charlie, globex, waiting, artifact):
    response = api_as(charlie, globex).post(
        f"/api/v1/runs/{waiting.id}/approvals",
        {"artifact_id": str(artifact.id), "artifact_sha256": artifact.sha256, "action": "publish"},
        format="json",
    )
    assert response.status_code == 404


def test_an_operator_lists_the_runs_requests(api_as, bob, acme, pending):
    response = api_as(bob, acme).get(f"/api/v1/runs/{pending.run_id}/approvals")
    assert response.status_code == 200
    assert [r["id"] for r in response.json()["results"]] == [str(pending.pk)]


# --- the queue -------------------------------------------------------------------------------
def test_the_queue_lists_what_the_caller_may_decide(as_carol, api_as, bob, alice, acme, pending):
    response = as_carol.get("/api/v1/approvals?status=pending")
    assert response.status_code == 200
    assert [r["id"] for r in response.json()["results"]] == [str(pending.pk)]
    assert response.json()["results"][0]["artifact_sha256"] == pending.artifact_sha256
    assert api_as(alice, acme).get("/api/v1/approvals").json()["results"][0]["id"] == str(
        pending.pk
    )
    assert api_as(bob, acme).get("/api/v1/approvals").status_code == 403  # no review role


def test_the_queue_refuses_an_unknown_status(as_carol):
    response = as_carol.get("/api/v1/approvals?status=maybe")
    assert response.status_code == 400 and response.json()["code"] == "invalid_request"


def test_another_tenant_sees_nothing_in_its_queue(api_as, charlie, globex, pending):
    assert api_as(charlie, globex).get("/api/v1/approvals").json()["results"] == []
    assert api_as(charlie, globex).get(f"/api/v1/approvals/{pending.pk}").status_code == 404


# --- deciding ----------------------------------------------------------------------------------
def test_a_reviewer_approves_the_exact_artifact(as_carol, pending):
    response = decision_of(as_carol, pending, comment="checked every citation")
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["decision"]["decision"] == "approve"
    assert body["decision"]["approver"] == "carol"
    assert body["decision"]["artifact_sha256"] == pending.artifact_sha256
    assert body["request"]["status"] == "approved"
    assert as_carol.get("/api/v1/approvals?status=approved").json()["results"][0]["id"] == str(
        pending.pk
    )


def test_a_reject_fails_the_run_with_the_comment(as_carol, pending):
    response = decision_of(as_carol, pending, "reject", comment="Claim 2 is unsourced.")
    assert response.status_code == 200
    run = pending.run
    run.refresh_from_db()
    assert run.status == RunStatus.FAILED and "Claim 2 is unsourced." in run.status_reason


def test_it_refuses_an_expired_request_with_409(as_carol, pending):
    expire_now(pending)
    response = decision_of(as_carol, pending)
    assert response.status_code == 409 and response.json()["code"] == "approval_expired"
    pending.refresh_from_db()
    assert pending.status == ApprovalStatus.EXPIRED and not ApprovalDecision.objects.exists()


def test_it_refuses_a_wrong_hash_with_409(as_carol, pending):
    response = decision_of(as_carol, pending, sha="0" * 64)
    assert response.status_code == 409 and response.json()["code"] == "artifact_hash_mismatch"
    assert response.json()["detail"]


def test_it_refuses_a_stale_version_with_409(as_carol, pending):
    move(pending.run, "review")
    response = decision_of(as_carol, pending)
    assert response.status_code == 409 and response.json()["code"] == "approval_stale"


def test_it_refuses_self_approval_with_409(api_as, alice, acme, waiting, artifact):
    api = api_as(alice, acme)
    created = api.post(
        f"/api/v1/runs/{waiting.id}/approvals",
        {"artifact_id": str(artifact.id), "artifact_sha256": artifact.sha256, "action": "publish"},
        format="json",
    ).json()
    response = api.post(
        f"/api/v1/approvals/{created['id']}/decision",
        {"decision": "approve", "artifact_sha256": artifact.sha256},
        format="json",
    )
    assert response.status_code == 409 and response.json()["code"] == "self_approval_forbidden"


def test_it_refuses_a_double_decision_with_409(as_carol, waiting, artifact, bob):
    request = ask(waiting, artifact, bob, required_approvals=2)
    assert decision_of(as_carol, request).status_code == 200
    response = decision_of(as_carol, request, "reject", comment="changed my mind")
    assert response.status_code == 409 and response.json()["code"] == "already_decided"


def test_a_decision_on_another_tenants_request_is_404(api_as, charlie, globex, pending):
    response = decision_of(api_as(charlie, globex), pending)
    assert response.status_code == 404
    assert not ApprovalDecision.objects.exists()


def test_an_operator_may_not_decide(api_as, bob, acme, pending):
    assert decision_of(api_as(bob, acme), pending).status_code == 403


def test_a_decision_with_bad_input_is_400(as_carol, pending):
    url = f"/api/v1/approvals/{pending.pk}/decision"
    for body in ({}, {"decision": "maybe", "artifact_sha256": pending.artifact_sha256}):
        response = as_carol.post(url, body, format="json")
        assert response.status_code == 400 and response.json()["code"] == "invalid_request"
    assert as_carol.post(url, "{not json", content_type="application/json").status_code == 400


# --- the artifact under review -------------------------------------------------------------------
def test_a_reviewer_reads_the_artifact_under_review_and_the_read_is_audited(
    as_carol, pending, artifact
):
    response = as_carol.get(f"/api/v1/approvals/{pending.pk}/artifact")
    assert response.status_code == 200
    assert response.content == artifact_bytes(artifact)
    assert response["X-Artifact-Sha256"] == artifact.sha256
    assert AuditEvent.objects.filter(
        action="artifact.read", actor_label="carol", target=str(artifact.id)
    ).exists()
    # The general artifact endpoints stay closed to a reviewer.
    assert as_carol.get(f"/api/v1/artifacts/{artifact.id}/content").status_code == 403


def test_another_tenant_cannot_read_the_artifact_under_review(api_as, charlie, globex, pending):
    assert (
        api_as(charlie, globex).get(f"/api/v1/approvals/{pending.pk}/artifact").status_code == 404
    )


def artifact_bytes(artifact):  # noqa: ANN001, ANN201
    from checkpoints.services.artifacts import artifact_content

    return artifact_content(artifact)


def test_the_openapi_document_lists_the_approval_endpoints(client):
    paths = yaml.safe_load(client.get("/api/v1/schema").content)["paths"]
    assert {"get", "post"} <= set(paths["/api/v1/runs/{run_id}/approvals"])
    assert "get" in paths["/api/v1/approvals"]
    assert "get" in paths["/api/v1/approvals/{approval_id}"]
    assert "get" in paths["/api/v1/approvals/{approval_id}/artifact"]
    decision = paths["/api/v1/approvals/{approval_id}/decision"]["post"]["responses"]
    assert {"200", "400", "404", "409"} <= set(decision)


def test_the_queue_query_count_does_not_grow_with_the_queue(as_carol, waiting, artifact, bob):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    ask(waiting, artifact, bob)
    as_carol.get("/api/v1/approvals")  # the token's first use records its last use
    with CaptureQueriesContext(connection) as one:
        assert len(as_carol.get("/api/v1/approvals").json()["results"]) == 1
    for index in range(6):
        ask(waiting, draft(waiting.tenant, f"# Draft {index}\n"), bob, action=f"send-{index}")
    with CaptureQueriesContext(connection) as seven:
        assert len(as_carol.get("/api/v1/approvals").json()["results"]) == 7
    assert len(seven) == len(one)
