"""The browser session authenticates the API too, with CSRF enforced on writes."""

from __future__ import annotations

import pytest
from django.middleware.csrf import _get_new_csrf_string
from django.test import Client

pytestmark = pytest.mark.django_db


def test_a_signed_in_operator_reads_runs_with_the_session(run, bob):
    client = Client(enforce_csrf_checks=True)
    client.force_login(bob)
    response = client.get("/api/v1/runs")
    assert response.status_code == 200
    assert [r["id"] for r in response.json()["results"]] == [str(run.id)]


def test_a_session_write_without_the_csrf_token_is_refused(run, bob):
    client = Client(enforce_csrf_checks=True)
    client.force_login(bob)
    response = client.post(
        f"/api/v1/runs/{run.id}/checkpoints",
        {"expected_version": 1, "state": "draft_answer", "envelope": {}},
        content_type="application/json",
    )
    assert response.status_code == 403
    assert "CSRF" in response.json()["detail"]
    run.refresh_from_db()
    assert run.version == 1


def test_a_session_write_with_the_csrf_token_is_accepted(run, bob):
    client = Client(enforce_csrf_checks=True)
    client.force_login(bob)
    token = _get_new_csrf_string()
    client.cookies["csrftoken"] = token
    response = client.post(
        f"/api/v1/runs/{run.id}/checkpoints",
        {"expected_version": 1, "state": "draft_answer", "envelope": {}},
        content_type="application/json",
        HTTP_X_CSRFTOKEN=token,
    )
    assert response.status_code == 201, response.content


def test_a_signed_in_user_without_a_tenant_is_refused(django_user_model):
    client = Client()
    client.force_login(django_user_model.objects.create(username="nobody"))
    response = client.get("/api/v1/runs")
    assert response.status_code == 403
    assert "not a member" in response.json()["detail"]
