"""Forms that say a reason is recorded refuse an empty one: a reject (page and API) and a
legal hold on or off. Nothing is changed by a refused request."""

from __future__ import annotations

import pytest
from django.test import Client
from django.urls import reverse

from approvals.models import ApprovalDecision, ApprovalStatus
from checkpoints.models import RunStatus
from tenants.models import Tenant
from tests.approvals_support import ask, at_review, draft, worker_run
from tests.retention_support import build

pytestmark = pytest.mark.django_db


def test_a_reject_without_a_reason_is_refused_on_the_page_and_the_api(acme, bob, carol, api_as):
    artifact = draft(acme)
    run = at_review(worker_run(acme, bob), artifact)
    request = ask(run, artifact, bob)
    client = Client()
    client.force_login(carol)
    body = {"decision": "reject", "artifact_sha256": request.artifact_sha256, "comment": "  "}
    page = client.post(f"/approvals/{request.pk}/decision", body)
    assert page.status_code == 400
    assert "Give a reason for the rejection" in page.content.decode()
    api = api_as(carol, acme).post(f"/api/v1/approvals/{request.pk}/decision", body, format="json")
    assert api.status_code == 400 and api.json()["fields"] == {
        "comment": "required for a rejection"
    }
    request.refresh_from_db()
    assert request.status == ApprovalStatus.PENDING
    assert not ApprovalDecision.objects.exists()


def test_a_legal_hold_without_a_reason_is_refused(alice, acme, bob, workflow):
    run = build(acme, bob, status=RunStatus.SUCCEEDED).run
    client = Client()
    client.force_login(alice)
    hold = reverse("console:retention_hold")
    for body in (
        {"scope": "tenant", "on": "1", "reason": ""},
        {"scope": "run", "on": "1", "run_id": str(run.pk), "reason": " "},
    ):
        response = client.post(hold, body)
        assert response.status_code == 422
        assert "Give a reason" in response.content.decode()
    assert not Tenant.objects.get(pk=acme.pk).legal_hold
    run.refresh_from_db()
    assert not run.legal_hold
    Tenant.objects.filter(pk=acme.pk).update(legal_hold=True)
    release = client.post(hold, {"scope": "tenant", "on": "0", "confirm": "1", "reason": ""})
    assert release.status_code == 422 and "Give a reason" in release.content.decode()
    assert Tenant.objects.get(pk=acme.pk).legal_hold
