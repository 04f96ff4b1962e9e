"""A cursor is opaque and signed: only one the API issued (in ``next`` or ``previous``)
moves a page; anything else, including text base64 ignores such as ``%%%``, is a 400."""

from __future__ import annotations

import base64

import pytest

from tests.api_support import every_list, new_run

pytestmark = pytest.mark.django_db


@pytest.fixture
def api(api_as, bob, acme, workflow):  # noqa: ANN001
    return api_as(bob, acme)


@pytest.mark.parametrize(
    "raw",
    [
        "%25%25%25",  # "%%%": base64 skips every character, DRF read it as the first page
        "",
        "%3D%3D%3D%3D",  # "===="
        base64.b64encode(b"o=1").decode(),  # well-formed, but not one the API signed
        base64.b64encode(b"").decode() + "%3Aforged",
    ],
    ids=["percent-signs", "empty", "padding", "unsigned", "forged-signature"],
)
def test_a_cursor_the_api_did_not_issue_is_a_400_on_every_list(api, raw):  # noqa: ANN001
    for path in every_list(new_run(api)):
        response = api.get(f"{path}?cursor={raw}")
        assert response.status_code == 400, (path, raw, response.content)
        body = response.json()
        assert body["code"] == "invalid_request" and "cursor" in body["fields"], body


def test_the_cursors_the_api_issues_page_forward_and_back(api):  # noqa: ANN001
    for _ in range(5):
        new_run(api)
    first = api.get("/api/v1/runs", {"limit": 2}).json()
    assert first["next"], first
    second = api.get(first["next"]).json()
    third = api.get(second["next"]).json()
    back = api.get(second["previous"]).json()
    ids = [r["id"] for page in (first, second, third) for r in page["results"]]
    assert len(ids) == len(set(ids)) == 5
    assert [r["id"] for r in back["results"]] == [r["id"] for r in first["results"]]


@pytest.mark.django_db
@pytest.mark.parametrize("limit", ["null", "true", "-18882", "text", "0", "501", "1.5", "", "５"])
def test_a_limit_that_is_not_1_to_500_is_a_400(api_as, alice, acme, limit):  # noqa: ANN001
    for path in ("/api/v1/runs", "/api/v1/workflows", "/api/v1/approvals"):
        answer = api_as(alice, acme).get(path, {"limit": limit})
        assert answer.status_code == 400, (path, limit, answer.content)
        assert answer.json()["fields"] == {"limit": "a whole number from 1 to 500"}


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/api/v1/runs", {"workflow_type": 5}),
        ("/api/v1/runs", {"workflow_type": "research", "objective_ref": 0}),
        ("/api/v1/runs", {"workflow_type": "research", "budget": {"max_attempts": "5"}}),
        ("/api/v1/runs", {"workflow_type": "research", "budget": {"max_attempts": True}}),
    ],
)
def test_a_value_of_another_json_type_is_a_400_not_coerced(api_as, bob, acme, workflow, path, body):  # noqa: ANN001
    answer = api_as(bob, acme).post(path, body, format="json")
    assert answer.status_code == 400, answer.content
    assert answer.json()["code"] == "invalid_request"


@pytest.mark.django_db
def test_the_document_says_what_the_api_enforces(client):  # noqa: ANN001
    document = client.get("/api/v1/schema?format=json").json()
    schemas = document["components"]["schemas"]
    assert schemas["RunCreateRequest"]["additionalProperties"] is False
    assert schemas["ApprovalRequest"]["properties"]["previous_request_id"]["nullable"] is True
    assert all(schemas["Webhook"]["properties"][f].get("nullable") for f in ("url", "secret_ref"))
    runs = document["paths"]["/api/v1/runs"]["get"]
    limit = next(p for p in runs["parameters"] if p["name"] == "limit")
    assert (limit["schema"]["minimum"], limit["schema"]["maximum"]) == (1, 500)
    assert "414" in runs["responses"]
