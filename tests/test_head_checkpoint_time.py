"""The run's row carries when its head checkpoint was written (``latest_checkpoint_at``),
so "the oldest checkpoint of an active run" (Health, the checkpoint-age metrics) is read
from the runs alone, by an index, never by joining every active run's head checkpoint.
Every writer of a head keeps it equal to that checkpoint's ``created_at``."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from checkpoints.models import Checkpoint, Run
from runtime.services.forks import run_fork
from tenants.services import Actor
from tests.console_data import story_run

pytestmark = pytest.mark.django_db


def _head_time_agrees(run: Run) -> None:
    run.refresh_from_db()
    head = Checkpoint.objects.get(pk=run.latest_checkpoint_id)
    assert run.latest_checkpoint_at is not None
    assert abs(run.latest_checkpoint_at - head.created_at) < timedelta(milliseconds=50)


def test_every_writer_of_a_head_records_when_it_was_written(acme, bob, workflow):
    run = story_run(acme, bob)  # a start, then commits
    _head_time_agrees(run)
    fork = run_fork(
        tenant=acme, run_id=run.pk, from_sequence=1, reason="try again", actor=Actor(user=bob)
    )
    _head_time_agrees(fork.run)


def test_health_finds_the_oldest_head_without_reading_checkpoints(alice, bob, acme, workflow):
    from django.test import Client

    older = story_run(acme, bob, objective="older")
    story_run(acme, bob, objective="newer")
    Run.objects.filter(pk=older.pk).update(latest_checkpoint_at=timezone.now() - timedelta(hours=5))
    client = Client()
    client.force_login(alice)
    with CaptureQueriesContext(connection) as queries:
        page = client.get("/health/").content.decode()
    assert f"/runs/{older.pk}/" in page.split('id="oldest-runs"')[1].split("</li>")[0]
    assert "5\xa0hours" in page.split('id="oldest-age"')[1][:80]
    checkpoint_reads = [
        q["sql"] for q in queries.captured_queries if 'FROM "checkpoints_checkpoint"' in q["sql"]
    ]
    assert checkpoint_reads == []
