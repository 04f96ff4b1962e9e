"""Expiry is visible and ends: a request created to expire in 15 s is renewed once, with the
workflow's TTL (not its own 15 s), the run's status reason says the approval expired, and
a second expiry raises nothing more."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from approvals.models import ApprovalRequest, ApprovalStatus
from approvals.services import approval_expire_due
from checkpoints.models import RunStatus
from tests.approvals_support import ask, at_review, draft, expire_now, worker_run

pytestmark = pytest.mark.django_db


def test_an_expired_request_is_renewed_once_with_the_workflow_ttl(settings, acme, bob):
    settings.CAIRN_APPROVAL_TTL_SECONDS = 3 * 3600
    artifact = draft(acme)
    run = at_review(worker_run(acme, bob), artifact)
    short = ask(run, artifact, bob, expires_at=timezone.now() + timedelta(seconds=15))
    expire_now(short)
    assert approval_expire_due() == 1

    renewed = ApprovalRequest.objects.get(run=run, status=ApprovalStatus.PENDING)
    assert renewed.previous_id == short.pk
    left = renewed.expires_at - timezone.now()
    assert timedelta(hours=2, minutes=59) < left <= timedelta(hours=3)
    run.refresh_from_db()
    assert run.status == RunStatus.WAITING_APPROVAL
    assert run.status_reason.startswith("approval expired at")
    assert "a new request was raised" in run.status_reason

    # Nobody decides the renewal either: it expires, and no third request follows.
    expire_now(renewed)
    assert approval_expire_due() == 1
    assert approval_expire_due() == 0
    assert ApprovalRequest.objects.filter(run=run).count() == 2
    assert not ApprovalRequest.objects.filter(run=run, status=ApprovalStatus.PENDING).exists()
    run.refresh_from_db()
    assert run.status == RunStatus.WAITING_APPROVAL
    assert "no new request is raised" in run.status_reason

    # The operator sees it on the run page.
    client = Client()
    client.force_login(bob)
    page = client.get(f"/runs/{run.pk}/").content.decode()
    assert "approval expired at" in page and "no new request is raised" in page
