"""Reviewers are told, on real parts end to end: the demo run reaches its approval state on
a real Celery worker, the request's outbox message is published after its commit, the
worker plans and delivers, and a real SMTP server on loopback receives one email per
reviewer who may decide it, with the review page's link."""

from __future__ import annotations

import pytest

from approvals.models import ApprovalNotification, ApprovalRequest
from tests.approvals_support import start_demo
from tests.smtp_support import PUBLIC_URL, smtp_worker_env
from tests.worker_fixtures import wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.worker]


def test_a_worker_raised_request_is_emailed_to_its_reviewer_once(
    acme, bob, carol, worker_factory, smtp_server
):  # noqa: ANN001
    carol.email = "carol@example.org"
    carol.save()
    worker_factory("w1", env=smtp_worker_env(smtp_server))
    run = start_demo(acme, bob)
    request = wait_for(
        lambda: ApprovalRequest.objects.filter(run=run).first(),
        what="the demo run to ask for approval",
        timeout=180,
    )
    wait_for(
        lambda: smtp_server.to("carol@example.org"),
        what="carol's notification email",
        timeout=60,
    )
    message = smtp_server.to("carol@example.org")[0]
    assert f"{PUBLIC_URL}/approvals/{request.pk}/" in message.get_payload(decode=True).decode()
    assert smtp_server.to("bob@example.org") == []  # he started the run: four eyes
    # The worker marks the row sent after the SMTP server has the message (send, then
    # record: a crash between them sends again, never loses it), so the mark is waited for.
    row = wait_for(
        lambda: ApprovalNotification.objects.filter(
            request=request, user=carol, sent_at__isnull=False
        ).first(),
        what="carol's notification marked sent",
    )
    assert row.channel == "email"
    assert len(smtp_server.messages) == 1
