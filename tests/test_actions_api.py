"""POST /api/v1/runs/{id}/actions/…: status codes, error codes and the audit trail."""

from __future__ import annotations

import pytest
import yaml
from openapi_spec_validator import validate

from checkpoints.models import Checkpoint, Run, RunStatus
from runtime.services.leases import lease_acquire, lease_release
from tests.actions_support import advance, audit_events, operation, worker_run

pytestmark = pytest.mark.django_db


@pytest.fixture
def wrun(acme, bob):  # noqa: ANN001
    run = worker_run(acme, bob)
    return advance(advance(run, bob, "draft_answer"), bob, "review")


@pytest.fixture
def api(api_as, bob, acme):  # noqa: ANN001
    return api_as(bob, acme)


def url(run, action: str) -> str:  # noqa: ANN001
    return f"/api/v1/runs/{run.id}/actions/{action}"


def test_resume_returns_the_running_run(api, wrun, bob):
    paused = advance(wrun, bob, "review", status="paused_for_review")
    response = api.post(url(paused, "resume"), {"expected_version": paused.version}, format="json")
    assert response.status_code == 200, response.json()
    body = response.json()
    assert (body["status"], body["version"]) == ("running", paused.version + 1)
    assert audit_events(paused, "run.resume")[0].actor.username == "bob"


def test_resume_with_a_stale_version_is_409_and_changes_nothing(api, wrun, bob):
    paused = advance(wrun, bob, "review", status="paused_for_review")
    response = api.post(url(paused, "resume"), {"expected_version": 1}, format="json")
    assert response.status_code == 409
    body = response.json()
    assert body["code"] == "concurrent_checkpoint_write"
    assert "changed since you loaded it" in body["detail"]
    paused.refresh_from_db()
    assert paused.status == "paused_for_review"


def test_resume_needs_the_expected_version(api, wrun):
    response = api.post(url(wrun, "resume"), {}, format="json")
    assert response.status_code == 400
    assert response.json()["fields"] == {"expected_version": "This field is required."}


def test_cancel_returns_the_cancelled_run_and_records_the_reason(api, wrun):
    response = api.post(url(wrun, "cancel"), {"reason": "duplicate request"}, format="json")
    assert response.status_code == 200
    assert response.json()["status"] == "cancelled"
    (event,) = audit_events(wrun, "run.cancel")
    assert event.reason == "duplicate request"


def test_cancel_with_an_open_operation_is_cancelling(api, wrun):
    operation(wrun, "pub-1", "pending")
    response = api.post(url(wrun, "cancel"), {"reason": "stop"}, format="json")
    assert response.json()["status"] == "cancelling"


@pytest.mark.parametrize("body", [{}, {"reason": ""}, {"reason": "   "}])
def test_an_action_without_a_reason_is_400(api, wrun, body):  # noqa: ANN001
    response = api.post(url(wrun, "cancel"), body, format="json")
    assert response.status_code == 400
    assert response.json()["code"] == "invalid_request"
    assert "reason" in response.json()["fields"]
    wrun.refresh_from_db()
    assert wrun.status == RunStatus.WAITING_APPROVAL


def test_an_action_on_a_terminal_run_is_409_run_not_active(api, wrun):
    api.post(url(wrun, "cancel"), {"reason": "stop"}, format="json")
    response = api.post(url(wrun, "cancel"), {"reason": "again"}, format="json")
    assert (response.status_code, response.json()["code"]) == (409, "run_not_active")
    response = api.post(url(wrun, "retry"), {"step": "draft", "reason": "x"}, format="json")
    assert (response.status_code, response.json()["code"]) == (409, "run_not_active")


def test_retry_returns_the_run_at_the_steps_state(api, wrun):
    response = api.post(
        url(wrun, "retry"),
        {"step": "draft", "reason": "bad citation", "expected_version": wrun.version},
        format="json",
    )
    assert response.status_code == 200, response.json()
    body = response.json()
    assert (body["state"], body["step"], body["status"]) == ("draft_answer", "draft", "running")
    assert body["checkpoint_sequence"] == 4


def test_retry_of_an_unknown_step_is_422(api, wrun):
    response = api.post(url(wrun, "retry"), {"step": "nope", "reason": "x"}, format="json")
    assert response.status_code == 422
    assert response.json()["code"] == "unknown_step"
    assert "collect, draft, publish_answer" in response.json()["detail"]


def test_no_action_moves_a_waiting_run_past_its_approval_409(api, wrun, bob):
    """The run waits at review: retrying publish over the API is refused, a fork from a
    checkpoint past the approval state too, and nothing is written."""
    before = wrun.checkpoint_sequence
    response = api.post(
        url(wrun, "retry"), {"step": "publish_answer", "reason": "x"}, format="json"
    )
    assert (response.status_code, response.json()["code"]) == (409, "action_not_allowed")
    assert "has not reached step publish_answer" in response.json()["detail"]
    assert Checkpoint.objects.filter(run=wrun).count() == before
    published = advance(wrun, bob, "publish")
    response = api.post(
        url(published, "fork"), {"from_sequence": 4, "reason": "again"}, format="json"
    )
    assert (response.status_code, response.json()["code"]) == (409, "action_not_allowed")
    assert "past the approval state review" in response.json()["detail"]
    preview = api.get(url(published, "fork/preview") + "?from_sequence=4")
    assert preview.status_code == 409
    assert Run.objects.count() == 1


def test_fork_is_201_with_the_new_run_and_its_warnings(api, wrun, bob):
    run = advance(wrun, bob, "publish")
    operation(run, "pub-1", "confirmed")
    response = api.post(
        url(run, "fork"),
        {"from_sequence": 2, "inputs_patch": {"lang": "fr"}, "reason": "French edition"},
        format="json",
    )
    assert response.status_code == 201, response.json()
    body = response.json()
    assert body["id"] != str(run.id)
    assert (body["forked_from_run"], body["forked_from_checkpoint"]) == (str(run.id), 2)
    assert [w["idempotency_key"] for w in body["warnings"]] == ["pub-1"]
    assert "may perform it again" in body["warnings"][0]["detail"]
    fork = Run.objects.get(pk=body["id"])
    assert Checkpoint.objects.get(run=fork).parent_sha256 == (
        Checkpoint.objects.get(run=run, sequence=2).sha256
    )
    preview = api.get(url(run, "fork/preview") + "?from_sequence=2")
    assert preview.status_code == 200
    assert preview.json() == {"from_sequence": 2, "warnings": body["warnings"]}


def test_fork_of_an_unknown_sequence_is_422(api, wrun):
    response = api.post(url(wrun, "fork"), {"from_sequence": 99, "reason": "x"}, format="json")
    assert (response.status_code, response.json()["code"]) == (422, "unknown_checkpoint")
    preview = api.get(url(wrun, "fork/preview") + "?from_sequence=99")
    assert preview.status_code == 422
    assert api.get(url(wrun, "fork/preview")).status_code == 400


def test_fork_with_a_patch_that_is_not_an_object_is_400(api, wrun):
    response = api.post(
        url(wrun, "fork"), {"from_sequence": 1, "inputs_patch": [1], "reason": "x"}, format="json"
    )
    assert response.status_code == 400
    assert "inputs_patch" in response.json()["fields"]


def test_grant_budget_raises_the_limits(api_as, acme, bob):
    run = worker_run(acme, bob, budget={"max_attempts": 1, "max_cost": 0.5})
    response = api_as(bob, acme).post(
        url(run, "grant_budget"),
        {"attempts": 2, "cost": 0.25, "reason": "flaky provider"},
        format="json",
    )
    assert response.status_code == 200, response.json()
    body = response.json()
    assert body["budget_limits"]["max_attempts"] == 3
    assert body["budget_limits"]["max_cost"] == 0.75
    assert audit_events(run, "run.budget_grant")[0].reason == "flaky provider"


def test_grant_budget_refuses_unknown_fields(api, wrun):
    response = api.post(url(wrun, "grant_budget"), {"money": 5, "reason": "x"}, format="json")
    assert response.status_code == 400
    assert response.json()["fields"] == {"money": "Unknown field."}


ACTIONS = [
    ("resume", {"expected_version": 3}),
    ("cancel", {"reason": "x"}),
    ("retry", {"step": "draft", "reason": "x"}),
    ("fork", {"from_sequence": 1, "reason": "x"}),
    ("grant_budget", {"attempts": 1, "reason": "x"}),
]


@pytest.mark.parametrize(("action", "body"), ACTIONS)
def test_a_reviewer_may_not_act(api_as, carol, acme, wrun, action, body):  # noqa: ANN001
    response = api_as(carol, acme).post(url(wrun, action), body, format="json")
    assert (response.status_code, response.json()["code"]) == (403, "permission_denied")


@pytest.mark.parametrize(("action", "body"), ACTIONS)
def test_another_tenants_run_is_404(api_as, charlie, globex, wrun, action, body):  # noqa: ANN001
    response = api_as(charlie, globex).post(url(wrun, action), body, format="json")
    assert (response.status_code, response.json()["code"]) == (404, "not_found")
    wrun.refresh_from_db()
    assert (wrun.version, wrun.status) == (3, RunStatus.WAITING_APPROVAL)
    assert Run.objects.count() == 1


def test_an_admin_may_act(api_as, alice, acme, wrun):
    response = api_as(alice, acme).post(url(wrun, "cancel"), {"reason": "x"}, format="json")
    assert response.status_code == 200


def test_anonymous_callers_are_401(client, wrun):
    response = client.post(url(wrun, "cancel"), {"reason": "x"}, content_type="application/json")
    assert response.status_code == 401


def test_the_openapi_document_lists_the_actions(client):
    document = yaml.safe_load(client.get("/api/v1/schema").content)
    validate(document)
    paths = document["paths"]
    for action in ("resume", "cancel", "retry", "fork", "grant_budget"):
        operation_ = paths[f"/api/v1/runs/{{run_id}}/actions/{action}"]["post"]
        assert {"400", "403", "404", "409"} <= set(operation_["responses"]), action
    fork = paths["/api/v1/runs/{run_id}/actions/fork"]["post"]["responses"]
    assert {"201", "422"} <= set(fork)
    schema_ref = fork["201"]["content"]["application/json"]["schema"]["$ref"]
    fork_schema = document["components"]["schemas"][schema_ref.rsplit("/", 1)[-1]]
    assert "warnings" in fork_schema["properties"]
    assert "/api/v1/runs/{run_id}/actions/fork/preview" in paths
    grant = paths["/api/v1/runs/{run_id}/actions/grant_budget"]["post"]
    assert "lease_held" in grant["responses"]["409"]["description"]
    assert "worker holds the run's lease" in grant["description"]


def test_grant_budget_is_409_lease_held_while_a_worker_runs_the_run(api, acme, bob):
    run = worker_run(acme, bob, budget={"max_attempts": 3})
    lease_acquire(
        tenant=acme, run_id=run.id, owner="worker-a", ttl_seconds=60, expected_version=run.version
    )
    body = {"attempts": 2, "reason": "flaky provider", "expected_version": run.version}
    response = api.post(url(run, "grant_budget"), body, format="json")
    assert response.status_code == 409
    assert response.json()["code"] == "lease_held"
    assert response.json()["detail"].startswith(
        "A worker is running this run right now (worker-a holds its lease until "
    )
    run.refresh_from_db()
    assert (run.version, run.budget_limits["max_attempts"]) == (1, 3)
    assert audit_events(run, "run.budget_grant") == []
    lease_release(tenant=acme, run_id=run.id, owner="worker-a")
    response = api.post(url(run, "grant_budget"), body, format="json")
    assert response.status_code == 200, response.json()
    assert response.json()["budget_limits"]["max_attempts"] == 5
