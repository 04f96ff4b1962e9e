"""Alerts: which runs and operations an admin is warned about, on the health page and in
the menu."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from checkpoints.models import ExternalOperation, OperationStatus, OutboxMessage, Run, RunStatus
from checkpoints.services.outbox import outbox_enqueue
from observability.alerts import alerts_for_tenant
from tests.retention_support import build

pytestmark = pytest.mark.django_db


def _stalled(run, key: str, minutes: int):  # noqa: ANN001, ANN202
    op = ExternalOperation.objects.create(
        tenant_id=run.tenant_id,
        run=run,
        idempotency_key=key,
        action="publish",
        target="blog",
        request_fingerprint="f" * 64,
        status=OperationStatus.PENDING,
    )
    ExternalOperation.objects.filter(pk=op.pk).update(
        created_at=timezone.now() - timedelta(minutes=minutes),
        updated_at=timezone.now() - timedelta(minutes=minutes),
    )


@pytest.fixture
def sick(settings, acme, globex, bob, charlie, workflow):  # noqa: ANN001, ANN201
    settings.CAIRN_ALERT_RESTORES = 3
    settings.CAIRN_STALLED_OPERATION_SECONDS = 600
    settings.CAIRN_ALERT_OUTBOX_LAG_SECONDS = 60
    looping = build(acme, bob, status=RunStatus.SUCCEEDED, length=3).run
    fine = build(acme, bob, status=RunStatus.RUNNING, length=3).run
    Run.objects.filter(pk=looping.pk).update(restore_count=7)  # finished, still not healthy
    Run.objects.filter(pk=fine.pk).update(restore_count=3)  # at the bound, not above
    _stalled(fine, "stuck", 30)
    _stalled(fine, "recent", 2)
    # A command a worker should have received ten minutes ago (events of external runs are
    # recorded as sent: no consumer waits for them).
    outbox_enqueue(run=fine, kind="run.resume", payload={"run_id": str(fine.pk)})
    OutboxMessage.objects.filter(tenant=acme).update(
        created_at=timezone.now() - timedelta(minutes=10)
    )
    return {"looping": looping, "fine": fine}


def test_it_alerts_on_restores_stalled_operations_and_outbox_lag(acme, sick):
    alerts = alerts_for_tenant(acme)
    kinds = [alert.kind for alert in alerts]
    assert sorted(kinds) == ["outbox_lag", "restores", "stalled_operation"]
    assert alerts.count == 3
    restores = next(a for a in alerts if a.kind == "restores")
    assert restores.run_id == sick["looping"].pk
    assert "restored 7 times (more than 3)" in restores.message
    stalled = next(a for a in alerts if a.kind == "stalled_operation")
    assert stalled.run_id == sick["fine"].pk and "pending for 30 min" in stalled.message


def test_a_healthy_tenant_has_no_alert_and_another_tenants_do_not_leak(globex, sick):
    assert alerts_for_tenant(globex).count == 0


def test_the_bounds_come_from_settings(settings, acme, sick):
    settings.CAIRN_ALERT_RESTORES = 10
    settings.CAIRN_STALLED_OPERATION_SECONDS = 3600
    settings.CAIRN_ALERT_OUTBOX_LAG_SECONDS = 3600
    assert alerts_for_tenant(acme).count == 0


def test_the_health_page_lists_the_alerts_and_the_menu_counts_them(alice, sick):
    client = Client()
    client.force_login(alice)
    html = client.get(reverse("console:health")).content.decode()
    listed = re.search(r'<ul id="alert-list">.*?</ul>', html, re.S).group(0)
    assert listed.count("<li") == 3
    assert str(sick["looping"].pk) in listed  # a link to the run
    assert re.search(r'id="alert-count"[^>]*>3<', html)
    runs_page = client.get(reverse("console:runs")).content.decode()
    assert re.search(r'id="alert-count"[^>]*>3<', runs_page)


def test_operators_on_call_see_the_alerts_and_reviewers_do_not(bob, carol, sick):
    client = Client()
    client.force_login(bob)
    html = client.get(reverse("console:health")).content.decode()
    listed = re.search(r'<ul id="alert-list">.*?</ul>', html, re.S).group(0)
    assert listed.count("<li") == 3
    assert re.search(
        r'id="alert-count"[^>]*>3<', client.get(reverse("console:runs")).content.decode()
    )
    client.force_login(carol)
    inbox = client.get(reverse("approvals:inbox")).content.decode()
    assert 'id="alert-count"' not in inbox and "alert-list" not in inbox


def test_a_healthy_tenant_shows_no_alert_count(alice, acme, workflow):
    client = Client()
    client.force_login(alice)
    html = client.get(reverse("console:health")).content.decode()
    assert 'id="no-alerts"' in html and 'id="alert-count"' not in html
