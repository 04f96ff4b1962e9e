"""Tenant isolation on every endpoint, and the OpenAPI document."""

from __future__ import annotations

import pytest
import yaml
from openapi_spec_validator import validate

from checkpoints.services.artifacts import artifact_store

pytestmark = pytest.mark.django_db


@pytest.fixture
def acme_rows(run, acme):  # noqa: ANN001
    artifact, _ = artifact_store(tenant=acme, data=b"acme's draft", media_type="text/plain")
    return run, artifact


def endpoints(run, artifact) -> list[tuple[str, str, dict | None]]:  # noqa: ANN001
    return [
        ("get", f"/api/v1/runs/{run.id}", None),
        ("get", f"/api/v1/runs/{run.id}/checkpoints", None),
        (
            "post",
            f"/api/v1/runs/{run.id}/checkpoints",
            {"expected_version": 1, "state": "draft_answer", "envelope": {}},
        ),
        ("get", f"/api/v1/runs/{run.id}/checkpoints/1", None),
        ("get", f"/api/v1/runs/{run.id}/verify", None),
        (
            "post",
            f"/api/v1/runs/{run.id}/lease",
            {"owner": "w", "ttl_seconds": 10, "expected_version": 1},
        ),
        ("delete", f"/api/v1/runs/{run.id}/lease?owner=w", None),
        ("get", f"/api/v1/artifacts/{artifact.id}", None),
        ("get", f"/api/v1/artifacts/{artifact.id}/content", None),
    ]


def test_another_tenants_rows_are_404_on_every_endpoint(acme_rows, api_as, charlie, globex):
    run, artifact = acme_rows
    api = api_as(charlie, globex)
    for method, url, body in endpoints(run, artifact):
        response = (
            getattr(api, method)(url, body, format="json") if body else getattr(api, method)(url)
        )
        assert response.status_code == 404, (method, url, response.status_code)
        assert response.json()["code"] == "not_found"
    assert api.get("/api/v1/runs").json()["results"] == []
    assert run.version == type(run).objects.get(pk=run.pk).version


def test_a_reviewer_may_not_operate_runs(acme_rows, api_as, carol, acme):
    run, artifact = acme_rows
    api = api_as(carol, acme)
    for method, url, body in endpoints(run, artifact):
        response = (
            getattr(api, method)(url, body, format="json") if body else getattr(api, method)(url)
        )
        assert response.status_code == 403, (method, url)
        assert response.json()["code"] == "permission_denied"


def test_the_same_user_sees_each_tenant_only_through_its_own_token(
    acme_rows, api_as, alice, globex
):
    from tenants.services import Actor, member_set_role

    run, _ = acme_rows
    member_set_role(tenant=globex, user=alice, role="operator", actor=Actor.system("test"))
    in_globex = api_as(alice, globex)
    assert in_globex.get(f"/api/v1/runs/{run.id}").status_code == 404
    assert api_as(alice, run.tenant).get(f"/api/v1/runs/{run.id}").status_code == 200


def test_a_removed_members_token_stops_working_at_once(acme_rows, api_as, bob, acme):
    from tenants.services import Actor, member_set_role

    api = api_as(bob, acme)
    assert api.get("/api/v1/runs").status_code == 200
    member_set_role(tenant=acme, user=bob, role=None, actor=Actor.system("test"))
    assert api.get("/api/v1/runs").status_code == 401


def test_the_openapi_document_validates_and_lists_every_endpoint(client):
    response = client.get("/api/v1/schema")
    assert response.status_code == 200
    document = yaml.safe_load(response.content)
    validate(document)
    paths = document["paths"]
    expected = {
        "/api/v1/workflows": {"get"},
        "/api/v1/workflows/{workflow_type}/versions/{version}": {"put"},
        "/api/v1/runs": {"get", "post"},
        "/api/v1/runs/{run_id}": {"get"},
        "/api/v1/runs/{run_id}/checkpoints": {"get", "post"},
        "/api/v1/runs/{run_id}/checkpoints/{sequence}": {"get"},
        "/api/v1/runs/{run_id}/verify": {"get"},
        "/api/v1/runs/{run_id}/lease": {"post", "delete"},
        "/api/v1/artifacts": {"post"},
        "/api/v1/artifacts/{artifact_id}": {"get"},
        "/api/v1/artifacts/{artifact_id}/content": {"get"},
    }
    for path, methods in expected.items():
        assert path in paths, path
        assert methods <= set(paths[path]), (path, set(paths[path]))
    commit = paths["/api/v1/runs/{run_id}/checkpoints"]["post"]["responses"]
    assert {"201", "400", "404", "409", "413", "422"} <= set(commit)
