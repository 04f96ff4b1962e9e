"""Helpers for tests that drive the HTTP API with a token client."""

from __future__ import annotations


def new_run(api, **budget) -> dict:  # noqa: ANN001, ANN003
    response = api.post(
        "/api/v1/runs",
        {"workflow_type": "research", "execution": "external", "budget": budget or {}},
        format="json",
    )
    assert response.status_code == 201, response.content
    return response.json()


def every_list(run: dict) -> list[str]:
    """The API's paginated lists an operator reads, those of ``run`` among them."""
    return [
        "/api/v1/runs",
        "/api/v1/workflows",
        f"/api/v1/runs/{run['id']}/checkpoints",
        f"/api/v1/runs/{run['id']}/operations",
        f"/api/v1/runs/{run['id']}/approvals",
    ]
