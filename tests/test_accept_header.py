"""What every API route answers to the request's Accept and Content-Type headers.

The API answers JSON. A client that sends no usable preference (no Accept header, an empty
one, only blanks) gets JSON, as a client that sends none does (RFC 9110 lets a server
disregard the header); the commit's short path already read a blank header so, and DRF's
negotiation answered 406 to it, an answer the schema did not document. A client whose
Accept header excludes JSON gets the documented 406, and a body sent as another media type
to a route that takes JSON the documented 415.
"""

from __future__ import annotations

import pytest

from tests.acme_rows_support import api_client
from tests.factories import ENVELOPE_GROUPS
from tests.security_support import served_methods, walk

BLANKS = ("", "   ", " , ,")


def _api_get_routes() -> list:
    return [r for r in walk() if r.is_api and "GET" in served_methods(r.callback)]


@pytest.mark.django_db
def test_a_blank_accept_header_is_no_preference_on_every_api_route(acme_rows, alice, acme):
    client = api_client(alice, acme)  # alice holds every role in acme
    routes = _api_get_routes()
    assert len(routes) > 20  # the walk found the API
    for route in routes:
        url = acme_rows.url(route) + acme_rows.queries.get((route.name, "GET"), "")
        plain = client.get(url).status_code
        assert plain != 406, route.name
        for blank in BLANKS:
            answered = client.get(url, HTTP_ACCEPT=blank).status_code
            assert answered == plain, (route.name, repr(blank), answered, plain)


@pytest.mark.django_db
def test_a_commit_with_a_blank_accept_header_is_answered_alike_on_both_paths(alice, acme, run):
    client = api_client(alice, acme)
    version = run.version
    # The short path answers the plain request; a query string sends it to DRF's view.
    for query in ("", "?via=drf"):
        response = client.post(
            f"/api/v1/runs/{run.id}/checkpoints{query}",
            {
                "expected_version": version,
                "state": "draft_answer",
                "step": "draft_answer",
                "envelope": ENVELOPE_GROUPS,
            },
            format="json",
            HTTP_ACCEPT="",
        )
        assert response.status_code == 201, (query, response.content)
        version = response.json()["run_version"]


@pytest.mark.django_db
def test_an_accept_header_without_json_gets_the_documented_406(alice, acme):
    client = api_client(alice, acme)
    response = client.get("/api/v1/workflows", HTTP_ACCEPT="text/html")
    assert response.status_code == 406
    assert response.json()["code"] == "not_acceptable"
    schema = client.get("/api/v1/schema?format=json").json()
    secured = _secured_operations(schema)
    assert secured
    undocumented = [(p, m) for p, m, op in secured if "406" not in op["responses"]]
    assert undocumented == []


def _secured_operations(schema: dict) -> list[tuple[str, str, dict]]:
    return [
        (path, method, operation)
        for path, item in schema["paths"].items()
        for method, operation in item.items()
        if isinstance(operation, dict) and operation.get("security") not in (None, [{}])
    ]


@pytest.mark.django_db
def test_a_body_that_is_not_json_gets_the_documented_415(alice, acme):
    client = api_client(alice, acme)
    response = client.post("/api/v1/runs", "workflow_type=x", content_type="text/plain")
    assert response.status_code == 415
    assert response.json()["code"] == "unsupported_media_type"
    schema = client.get("/api/v1/schema?format=json").json()
    takes_json = [
        (path, method, operation)
        for path, method, operation in _secured_operations(schema)
        if "application/json" in operation.get("requestBody", {}).get("content", {})
    ]
    assert takes_json
    undocumented = [(p, m) for p, m, op in takes_json if "415" not in op["responses"]]
    assert undocumented == []
