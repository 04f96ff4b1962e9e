"""CI's Redis outlives a suite. A message that a worker killed with SIGKILL held
(unacknowledged) stays in Redis; kombu gives it back to the queue once the visibility
timeout has passed, an hour later, to whichever test's worker consumes then (the next CI
run's). The broker fixture starts each test with no message of an earlier one, held or
queued, so a worker in a test takes only that test's commands.

PostgreSQL pass only: it is the pass on Redis (RabbitMQ gives each test a queue of its own).
"""

from __future__ import annotations

import json
import time
import uuid

import pytest
import redis

from checkpoints.models import Run, RunStatus
from runtime.services.runs import run_create
from tenants.services import Actor
from tests.runtime_workflows import noop_six
from tests.worker_fixtures import broker_leftovers_clear, wait_for

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

VISIBILITY_TIMEOUT = 3600  # cairn.settings' for Redis


def _leave_a_message_a_killed_worker_held(client: redis.Redis) -> None:
    """As kombu's Redis transport records a message a consumer took: the queued message
    moved to the ``unacked`` hash, indexed by when it was taken (here: two hours ago, past
    the visibility timeout, so the next consumer gives it back to the queue)."""
    from cairn.celery import app

    stray = {"run_id": str(uuid.uuid4()), "expected_version": 1}
    app.send_task("checkpoints.run_advance", kwargs=stray, retry=False)
    raw = client.rpop("celery")
    assert raw is not None, "the stray command was not queued"
    message = json.loads(raw)
    tag = message["properties"]["delivery_tag"]
    client.hset("unacked", tag, json.dumps([message, "celery", "celery"]))
    client.zadd("unacked_index", {tag: time.time() - 2 * VISIBILITY_TIMEOUT})


def test_a_message_a_killed_worker_held_long_ago_never_reaches_a_later_tests_worker(
    acme, broker, worker_factory
):
    assert broker.url.startswith("redis://"), "this test is about Redis: set CAIRN_TEST_REDIS_URL"
    client = redis.Redis.from_url(broker.url)
    _leave_a_message_a_killed_worker_held(client)
    broker_leftovers_clear(broker)  # what the fixture does before every test

    worker = worker_factory("only")
    run = run_create(
        tenant=acme,
        workflow_type=noop_six.workflow_type,
        execution="worker",
        actor=Actor.system("t"),
    )
    wait_for(
        lambda: Run.objects.filter(pk=run.pk, status=RunStatus.SUCCEEDED).exists(),
        what="the run to succeed",
    )
    # Long enough for the worker's first look for expired messages (kombu: at its start,
    # then every ten seconds).
    wait_for(lambda: "ready" in worker.log(), what="the worker to be ready")
    time.sleep(1)
    log = worker.log()
    assert log.count("] received") == 1, log[-3000:]  # the run's one command, no other
    assert "missing" not in log, log[-3000:]
    assert not client.hlen("unacked")
