"""A pending operation is stalled by the age of its first attempt: a publish the provider
keeps answering with 500 is retried, every retry bumps ``updated_at``, and Health, the
metrics and the alerts still flag it. Runs created over the API get an attempts limit."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from checkpoints.models import ExternalOperation, Run
from observability.alerts import alerts_for_tenant
from runtime.services.operations import (
    operation_attempt,
    operation_mark_pending,
    operation_reserve,
)
from tenants.services import Actor

pytestmark = pytest.mark.django_db

WORKER = Actor.system("worker test")


def test_an_operation_retried_for_eleven_minutes_is_stalled(settings, acme, alice, run):
    settings.CAIRN_STALLED_OPERATION_SECONDS = 600
    op, _ = operation_reserve(
        tenant=acme,
        run_id=run.id,
        idempotency_key="publish-500",
        action="publish",
        target="blog/post",
        request_fingerprint="f" * 64,
        actor=WORKER,
    )
    operation_mark_pending(operation_id=op.id, actor=WORKER)
    # Its first attempt was 10 min 46 s ago; it was retried 19 times, the last just now.
    ExternalOperation.objects.filter(pk=op.pk).update(
        created_at=timezone.now() - timedelta(minutes=10, seconds=46)
    )
    for _ in range(19):
        operation_attempt(operation_id=op.id, note="the provider answered 500")
    op.refresh_from_db()
    assert op.updated_at > timezone.now() - timedelta(seconds=30)

    client = Client()
    client.force_login(alice)
    html = client.get(reverse("console:health")).content.decode()
    assert '<strong id="stalled-count">1<' in html
    assert re.search(r"pending for 10.minutes over 19 attempts", html)
    metrics = client.get("/metrics").text
    assert 'cairn_stalled_operations{tenant="acme"} 1' in metrics
    alerts = [a for a in alerts_for_tenant(tenant=acme) if a.kind == "stalled_operation"]
    assert len(alerts) == 1 and "over 19 attempt(s)" in alerts[0].message


def test_a_run_created_over_the_api_gets_the_default_attempts_limit(
    settings, acme, bob, workflow, api_as
):
    settings.CAIRN_DEFAULT_MAX_ATTEMPTS = 7
    api = api_as(bob, acme)
    made = api.post(
        "/api/v1/runs", {"workflow_type": "research", "inputs": {}}, format="json"
    ).json()
    assert Run.objects.get(pk=made["id"]).budget_limits["max_attempts"] == 7
    told = api.post(
        "/api/v1/runs",
        {"workflow_type": "research", "budget": {"max_attempts": 3, "max_tokens": 10}},
        format="json",
    ).json()
    assert Run.objects.get(pk=told["id"]).budget_limits["max_attempts"] == 3
    unlimited = api.post(
        "/api/v1/runs",
        {"workflow_type": "research", "budget": {"max_attempts": None}},
        format="json",
    ).json()
    assert Run.objects.get(pk=unlimited["id"]).budget_limits["max_attempts"] is None
