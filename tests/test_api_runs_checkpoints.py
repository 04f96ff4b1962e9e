"""API v1: runs, checkpoints, verify and leases, including every refusal docs/api.md lists."""

from __future__ import annotations

import pytest

from checkpoints.models import Checkpoint, Run
from tests.factories import SIMPLE_DEFINITION

pytestmark = pytest.mark.django_db


@pytest.fixture
def api(api_as, bob, acme, workflow):  # noqa: ANN001
    return api_as(bob, acme)


def start(api) -> dict:  # noqa: ANN001
    response = api.post(
        "/api/v1/runs",
        {
            "workflow_type": "research",
            "inputs": {"question": "why?"},
            "execution": "external",
            "budget": {"max_attempts": 3},
        },
        format="json",
    )
    assert response.status_code == 201, response.content
    return response.json()


def commit(api, run_id, **body):  # noqa: ANN001, ANN003, ANN201
    payload = {
        "expected_version": 1,
        "state": "draft_answer",
        "step": "draft_answer",
        "envelope": {},
    }
    payload.update(body)
    return api.post(f"/api/v1/runs/{run_id}/checkpoints", payload, format="json")


def test_a_new_run_has_every_documented_field(api):
    run = start(api)
    for field in [
        "id",
        "workflow_type",
        "workflow_version",
        "state",
        "step",
        "status",
        "version",
        "checkpoint_sequence",
        "restore_count",
        "budget_remaining",
        "lease_owner",
        "lease_expires_at",
        "forked_from_run",
        "forked_from_checkpoint",
        "created_at",
        "updated_at",
    ]:
        assert field in run
    assert (run["state"], run["status"], run["version"], run["checkpoint_sequence"]) == (
        "collect_sources",
        "running",
        1,
        1,
    )
    assert run["budget_remaining"]["attempts"] == 3


def test_it_commits_and_lists_the_history_oldest_first(api):
    run = start(api)
    first = commit(api, run["id"])
    assert first.status_code == 201
    body = first.json()
    assert set(body) >= {"sequence", "sha256", "parent_sha256", "run_version"}
    second = commit(api, run["id"], expected_version=2, state="review", step="review")
    assert second.json()["parent_sha256"] == body["sha256"]
    history = api.get(f"/api/v1/runs/{run['id']}/checkpoints").json()
    assert [c["sequence"] for c in history["results"]] == [1, 2, 3]
    assert history["next"] is None
    assert api.get(f"/api/v1/runs/{run['id']}").json()["status"] == "waiting_approval"


def test_it_answers_409_for_a_stale_expected_version(api):
    run = start(api)
    assert commit(api, run["id"]).status_code == 201
    stale = commit(api, run["id"], state="review")
    assert stale.status_code == 409
    assert stale.json()["code"] == "concurrent_checkpoint_write"
    assert Checkpoint.objects.filter(run_id=run["id"]).count() == 2


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        ({"state": "publish"}, 422, "illegal_transition"),
        ({"envelope": {"evidence": {"artifacts": "no"}}}, 422, "invalid_envelope"),
        ({"envelope": {"position": {}}}, 422, "invalid_envelope"),
        ({"envelope": {"inputs": {"password": "hunter2"}}}, 422, "secret_in_envelope"),
        ({"expected_version": "three"}, 400, "invalid_request"),
        ({"envelope": []}, 400, "invalid_request"),
        ({"unexpected": 1}, 400, "invalid_request"),
        (
            {
                "envelope": {
                    "evidence": {
                        "artifacts": [
                            {"id": "6f1c1a52-8a4b-4e43-9d5a-6d1c3c6c8d11", "sha256": "a" * 64}
                        ],
                        "validators": [],
                    }
                }
            },
            422,
            "artifact_hash_mismatch",
        ),
    ],
)
def test_it_refuses_bad_commits_with_the_documented_code(api, body, status, code):
    run = start(api)
    response = commit(api, run["id"], **body)
    assert response.status_code == status, response.content
    assert response.json()["code"] == code
    assert response.json()["detail"]
    assert Checkpoint.objects.filter(run_id=run["id"]).count() == 1
    assert Run.objects.get(pk=run["id"]).version == 1


def test_it_refuses_a_missing_field_and_malformed_json(api):
    run = start(api)
    missing = api.post(f"/api/v1/runs/{run['id']}/checkpoints", {"state": "x"}, format="json")
    assert missing.status_code == 400
    assert set(missing.json()["fields"]) >= {"expected_version", "envelope"}
    broken = api.post(
        f"/api/v1/runs/{run['id']}/checkpoints",
        data=b'{"expected_version": 1,',
        content_type="application/json",
    )
    assert broken.status_code == 400
    assert broken.json()["code"] == "invalid_request"
    nan = api.post(
        f"/api/v1/runs/{run['id']}/checkpoints",
        data=b'{"expected_version": NaN, "state": "a", "envelope": {}}',
        content_type="application/json",
    )
    assert nan.status_code == 400


def test_it_refuses_an_oversized_body_with_413(api, settings):
    settings.CAIRN_MAX_REQUEST_BYTES = 2048
    run = start(api)
    response = commit(api, run["id"], envelope={"inputs": {"blob": "x" * 4096}})
    assert response.status_code == 413
    assert response.json()["code"] == "payload_too_large"


def test_it_refuses_an_envelope_over_the_envelope_limit(api, settings):
    settings.CAIRN_MAX_ENVELOPE_BYTES = 1024
    run = start(api)
    response = commit(api, run["id"], envelope={"inputs": {"blob": "x" * 2048}})
    assert response.status_code == 413
    assert "artifact" in response.json()["detail"]


def test_it_refuses_a_checkpoint_on_a_finished_run(api):
    run = start(api)
    commit(api, run["id"])
    commit(api, run["id"], expected_version=2, state="review")
    commit(
        api,
        run["id"],
        expected_version=3,
        state="rejected",
        status="failed",
        status_reason="the reviewer said no",
    )
    response = commit(api, run["id"], expected_version=4, state="rejected")
    assert response.status_code == 409
    assert response.json()["code"] == "run_not_active"
    assert api.get(f"/api/v1/runs/{run['id']}").json()["status_reason"] == "the reviewer said no"


def test_it_refuses_an_unknown_workflow_and_a_bad_budget(api):
    unknown = api.post("/api/v1/runs", {"workflow_type": "nope"}, format="json")
    assert (unknown.status_code, unknown.json()["code"]) == (422, "unknown_workflow")
    bad = api.post(
        "/api/v1/runs", {"workflow_type": "research", "budget": {"max_tokens": -1}}, format="json"
    )
    assert (bad.status_code, bad.json()["code"]) == (400, "invalid_request")
    worker = api.post(
        "/api/v1/runs", {"workflow_type": "research", "execution": "worker"}, format="json"
    )
    assert worker.status_code == 400
    assert Run.objects.count() == 0


def test_the_envelope_of_a_checkpoint_is_readable_and_the_read_is_audited(api, acme):
    from tenants.models import AuditEvent

    run = start(api)
    response = api.get(f"/api/v1/runs/{run['id']}/checkpoints/1")
    assert response.status_code == 200
    envelope = response.json()["envelope"]
    assert envelope["inputs"]["values"] == {"question": "why?"}
    assert set(envelope) >= {
        "identity",
        "position",
        "inputs",
        "evidence",
        "side_effects",
        "budgets",
        "control",
        "compatibility",
    }
    assert AuditEvent.objects.filter(tenant=acme, action="checkpoint.read").count() == 1
    assert api.get(f"/api/v1/runs/{run['id']}/checkpoints/9").status_code == 404


def test_run_list_filters_and_paginates(api):
    runs = [start(api) for _ in range(3)]
    commit(api, runs[0]["id"])
    page = api.get("/api/v1/runs?limit=2").json()
    assert len(page["results"]) == 2 and page["next"]
    rest = api.get(page["next"]).json()
    assert len(rest["results"]) == 1 and rest["next"] is None
    assert api.get("/api/v1/runs?status=succeeded").json()["results"] == []
    assert len(api.get("/api/v1/runs?state=collect_sources").json()["results"]) == 2
    assert api.get("/api/v1/runs?status=bogus").status_code == 400


def test_workflow_registration_is_idempotent_and_conflicts_are_refused(api):
    url = "/api/v1/workflows/triage/versions/1"
    assert api.put(url, SIMPLE_DEFINITION, format="json").status_code == 201
    assert api.put(url, SIMPLE_DEFINITION, format="json").status_code == 200
    changed = {**SIMPLE_DEFINITION, "terminal": ["done"]}
    conflict = api.put(url, changed, format="json")
    assert (conflict.status_code, conflict.json()["code"]) == (409, "definition_conflict")
    invalid = api.put("/api/v1/workflows/x/versions/1", {"states": []}, format="json")
    assert invalid.status_code == 422
    assert "states" in invalid.json()["fields"]
    listed = {w["workflow_type"] for w in api.get("/api/v1/workflows").json()["results"]}
    assert {"research", "triage"} <= listed


def test_leases_are_exclusive_until_they_expire(api):
    run = start(api)
    url = f"/api/v1/runs/{run['id']}/lease"
    mine = api.post(url, {"owner": "w1", "ttl_seconds": 30, "expected_version": 1}, format="json")
    assert mine.status_code == 200 and mine.json()["owner"] == "w1"
    theirs = api.post(url, {"owner": "w2", "ttl_seconds": 30, "expected_version": 1}, format="json")
    assert (theirs.status_code, theirs.json()["code"]) == (409, "lease_held")
    # While w1 holds the lease, a commit without the lease owner is refused.
    refused = commit(api, run["id"])
    assert refused.status_code == 409 and refused.json()["code"] == "lease_held"
    assert commit(api, run["id"], lease_owner="w1").status_code == 201
    stale = api.post(url, {"owner": "w1", "ttl_seconds": 30, "expected_version": 1}, format="json")
    assert stale.json()["code"] == "concurrent_checkpoint_write"
    assert api.delete(f"{url}?owner=w1").status_code == 204
    again = api.post(url, {"owner": "w2", "ttl_seconds": 30, "expected_version": 2}, format="json")
    assert again.status_code == 200


def test_taking_over_an_expired_lease_counts_a_restore(api):
    from datetime import timedelta

    from django.utils import timezone

    run = start(api)
    url = f"/api/v1/runs/{run['id']}/lease"
    api.post(url, {"owner": "w1", "ttl_seconds": 30, "expected_version": 1}, format="json")
    Run.objects.filter(pk=run["id"]).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
    taken = api.post(url, {"owner": "w2", "ttl_seconds": 30, "expected_version": 1}, format="json")
    assert taken.status_code == 200
    assert taken.json()["restore_count"] == 1


def test_verify_reports_a_healthy_chain(api):
    run = start(api)
    commit(api, run["id"])
    result = api.get(f"/api/v1/runs/{run['id']}/verify").json()
    assert result == {"ok": True, "checkpoints": 2, "problems": []}


def test_requests_without_a_token_get_401_and_bad_tokens_too(client, run):
    assert client.get("/api/v1/runs").status_code == 401
    response = client.get("/api/v1/runs", HTTP_AUTHORIZATION="Bearer cairn_nope")
    assert response.status_code == 401
    assert response.json()["code"] == "not_authenticated"
