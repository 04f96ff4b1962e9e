"""The health page's queues and workers (issue 29, item 6): live and dead workers counted
by heartbeat age however many there are, the backlog per queue (the broker's waiting
messages and the tenant's due outbox commands), and each waiting run's next retry."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from checkpoints.models import OutboxMessage, Run, RunStatus, WorkerHeartbeat
from checkpoints.services import outbox
from runtime.queues import queues_backlog
from runtime.registry import workflow_ensure_registered
from tests.runtime_support import start

pytestmark = pytest.mark.django_db


def health(user) -> str:  # noqa: ANN001
    client = Client()
    client.force_login(user)
    response = client.get(reverse("console:health"))
    assert response.status_code == 200
    return response.content.decode()


def test_workers_are_counted_live_and_dead_past_the_listed_twenty(alice, acme):
    now = timezone.now()
    for index in range(2):
        WorkerHeartbeat.objects.create(worker_id=f"live{index}", last_seen_at=now)
    for index in range(23):
        WorkerHeartbeat.objects.create(
            worker_id=f"dead{index}", last_seen_at=now - timedelta(minutes=3 + index)
        )
    html = health(alice)
    assert '<strong id="workers-recent">2</strong> live' in html
    assert '<strong id="workers-dead">23</strong> dead' in html


def test_the_backlog_shows_broker_messages_and_due_commands(alice, acme, settings):
    settings.CAIRN_DISPATCH_ON_COMMIT = False
    assert workflow_ensure_registered("research", "1")
    runs = [start(acme, "research", question=f"q{i}") for i in range(3)]
    [before] = queues_backlog(tenant=acme)
    assert before.outbox_due == 3 and before.outbox_lag_seconds >= 0
    html = health(alice)
    row = re.search(r'<tr data-queue="[^"]+">.*?</tr>', html, re.S).group(0)
    assert re.search(r"data-outbox-due>3<", row)
    waiting_before = before.waiting
    assert waiting_before is not None and before.error == ""
    assert outbox.outbox_dispatch() == 3  # published: now they wait in the broker
    [after] = queues_backlog(tenant=acme)
    assert after.outbox_due == 0 and after.waiting == waiting_before + 3
    assert OutboxMessage.objects.filter(run__in=runs, sent_at__isnull=True).count() == 0


def test_a_broker_that_does_not_answer_is_said_not_a_500(alice, acme, monkeypatch):
    from runtime import queues

    def down(name):  # noqa: ANN001, ANN202
        return "", None, "the broker did not answer (OperationalError)"

    monkeypatch.setattr(queues, "_broker_waiting", down)
    html = health(alice)
    assert "the broker did not answer (OperationalError)" in html


def test_each_waiting_run_shows_its_next_retry_attempts_and_last_failure(alice, acme, settings):
    settings.CAIRN_DISPATCH_ON_COMMIT = False
    assert workflow_ensure_registered("research", "1")
    run = start(acme, "research", question="q", budget={"max_attempts": 7})
    due = timezone.now() + timedelta(minutes=5)
    Run.objects.filter(pk=run.pk).update(
        status=RunStatus.WAITING_RETRY,
        next_eligible_at=due,
        budget_used={"attempts_used": 2},
        status_reason="collect_sources failed: ConnectionError: the source did not answer",
    )
    html = health(alice)
    table = re.search(r'<table id="retrying-runs">.*?</table>', html, re.S).group(0)
    row = re.search(rf'<tr data-run-id="{run.pk}">.*?</tr>', table, re.S).group(0)
    assert "2 / 7" in row
    assert "ConnectionError: the source did not answer" in row
    assert "(in 4\xa0minutes)" in row or "(in 5\xa0minutes)" in row
    assert re.search(r'id="h-retrying">Waiting to retry <span class="count">1</span>', html)


def test_health_counts_the_paused_runs(alice, bob, acme, run):
    from runtime.services.pause import run_pause
    from tenants.services import Actor

    run_pause(tenant=acme, run_id=run.pk, reason="x", actor=Actor(user=bob))
    assert '<strong id="paused-count">1</strong>' in health(alice)
