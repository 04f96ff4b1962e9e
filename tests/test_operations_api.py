"""API v1 side effects: the contract of docs/api.md "Side effects", errors and tenant isolation."""

from __future__ import annotations

import pytest

from checkpoints.models import ExternalOperation
from tenants.models import AuditEvent

pytestmark = pytest.mark.django_db

FP = "a" * 64


def ops_url(run, key: str = "", verb: str = "") -> str:  # noqa: ANN001
    url = f"/api/v1/runs/{run.id}/operations"
    if key:
        url += f"/{key}"
    if verb:
        url += f"/{verb}"
    return url


def reserve_body(**overrides) -> dict:  # noqa: ANN003
    body = {
        "idempotency_key": "order-42-publish",
        "action": "publish",
        "target": "blog/why",
        "request_fingerprint": FP,
    }
    body.update(overrides)
    return body


@pytest.fixture
def as_bob(api_as, bob, acme):  # noqa: ANN001, ANN201
    return api_as(bob, acme)


def test_it_reserves_then_answers_the_same_request_with_200_and_another_with_409(run, as_bob):
    created = as_bob.post(ops_url(run), reserve_body(), format="json")
    assert created.status_code == 201, created.json()
    assert created.json()["status"] == "reserved"
    again = as_bob.post(ops_url(run), reserve_body(), format="json")
    assert again.status_code == 200
    assert again.json()["idempotency_key"] == "order-42-publish"
    reused = as_bob.post(ops_url(run), reserve_body(request_fingerprint="b" * 64), format="json")
    assert reused.status_code == 409
    assert reused.json()["code"] == "idempotency_key_reused"
    assert ExternalOperation.objects.count() == 1


@pytest.mark.parametrize(
    "body",
    [
        {"action": "publish", "target": "t", "request_fingerprint": FP},
        reserve_body(surprise=True),
        reserve_body(idempotency_key="a/b"),
        reserve_body(idempotency_key="x" * 201),
    ],
    ids=["missing-key", "unknown-field", "slash", "too-long"],
)
def test_it_refuses_a_malformed_reservation_with_400(run, as_bob, body: dict):
    response = as_bob.post(ops_url(run), body, format="json")
    assert response.status_code == 400
    assert response.json()["code"] == "invalid_request"
    assert ExternalOperation.objects.count() == 0


def test_it_lists_the_runs_operations_with_the_contract_fields(run, as_bob):
    as_bob.post(ops_url(run), reserve_body(), format="json")
    as_bob.post(ops_url(run), reserve_body(idempotency_key="second"), format="json")
    listed = as_bob.get(ops_url(run))
    assert listed.status_code == 200
    body = listed.json()
    assert [o["idempotency_key"] for o in body["results"]] == ["order-42-publish", "second"]
    assert body["next"] is None
    contract = {
        "idempotency_key",
        "action",
        "target",
        "status",
        "provider_operation_id",
        "attempts",
        "created_at",
        "updated_at",
    }
    assert contract <= set(body["results"][0])


def test_confirm_records_the_provider_id_and_a_repeat_is_harmless(run, as_bob):
    as_bob.post(ops_url(run), reserve_body(), format="json")
    body = {"provider_operation_id": "pub_7", "result": {"url": "/p/7"}}
    confirmed = as_bob.post(ops_url(run, "order-42-publish", "confirm"), body, format="json")
    assert confirmed.status_code == 200, confirmed.json()
    assert confirmed.json()["status"] == "confirmed"
    assert confirmed.json()["provider_operation_id"] == "pub_7"
    repeat = as_bob.post(ops_url(run, "order-42-publish", "confirm"), body, format="json")
    assert repeat.status_code == 200
    other = as_bob.post(
        ops_url(run, "order-42-publish", "confirm"),
        {"provider_operation_id": "pub_8"},
        format="json",
    )
    assert other.status_code == 409
    assert other.json()["code"] == "operation_state_conflict"
    failed = as_bob.post(ops_url(run, "order-42-publish", "fail"), {"reason": "no"}, format="json")
    assert failed.status_code == 409
    detail = as_bob.get(ops_url(run, "order-42-publish")).json()
    assert (detail["status"], detail["provider_operation_id"]) == ("confirmed", "pub_7")


def test_unknown_then_an_operator_records_the_outcome(run, as_bob, bob):
    as_bob.post(ops_url(run), reserve_body(), format="json")
    unknown = as_bob.post(
        ops_url(run, "order-42-publish", "unknown"), {"reason": "timed out"}, format="json"
    )
    assert unknown.status_code == 200
    assert unknown.json()["status"] == "unknown"
    bare = as_bob.post(ops_url(run, "order-42-publish", "unknown"))
    assert bare.status_code == 200
    failed = as_bob.post(
        ops_url(run, "order-42-publish", "fail"),
        {"reason": "the provider shows no such post"},
        format="json",
    )
    assert failed.status_code == 200
    assert failed.json()["status"] == "failed"
    event = AuditEvent.objects.get(action="operation.outcome_recorded")
    assert event.actor == bob
    assert event.reason == "the provider shows no such post"


def test_fail_needs_a_reason(run, as_bob):
    as_bob.post(ops_url(run), reserve_body(), format="json")
    response = as_bob.post(ops_url(run, "order-42-publish", "fail"), {}, format="json")
    assert response.status_code == 400
    assert "reason" in response.json()["fields"]


def test_another_tenants_run_and_operation_are_not_found(run, as_bob, api_as, charlie, globex):
    as_bob.post(ops_url(run), reserve_body(), format="json")
    outsider = api_as(charlie, globex)
    assert outsider.get(ops_url(run)).status_code == 404
    assert outsider.post(ops_url(run), reserve_body(), format="json").status_code == 404
    confirm = outsider.post(
        ops_url(run, "order-42-publish", "confirm"),
        {"provider_operation_id": "pub_x"},
        format="json",
    )
    assert confirm.status_code == 404
    assert ExternalOperation.objects.get().status == "reserved"


def test_an_unknown_key_is_404_and_a_reviewer_or_anonymous_caller_is_refused(
    run, as_bob, api_as, carol, acme, client
):
    missing = as_bob.post(ops_url(run, "nope", "fail"), {"reason": "x"}, format="json")
    assert missing.status_code == 404
    assert api_as(carol, acme).get(ops_url(run)).status_code == 403
    assert client.get(ops_url(run)).status_code == 401


def test_the_openapi_document_describes_the_operation_endpoints(client):
    schema = client.get("/api/v1/schema?format=json")
    assert schema.status_code == 200
    paths = schema.json()["paths"]
    assert "/api/v1/runs/{run_id}/operations" in paths
    for verb in ("confirm", "fail", "unknown"):
        assert f"/api/v1/runs/{{run_id}}/operations/{{key}}/{verb}" in paths
    post = paths["/api/v1/runs/{run_id}/operations"]["post"]
    assert {"200", "201", "409"} <= set(post["responses"])
