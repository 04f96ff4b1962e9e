"""Twenty writers race to commit a successor to the same parent: exactly one wins.

Runs on SQLite (file database, IMMEDIATE transactions) and, in CI, on real PostgreSQL.
"""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from collections import Counter

import pytest
from django.db import connection

from cairn.errors import ConcurrentCheckpointWrite
from checkpoints.models import Checkpoint, OutboxMessage, Run
from checkpoints.services.checkpoints import CommitRequest, checkpoint_commit
from checkpoints.services.integrity import run_verify
from tenants.services import Actor, token_issue

pytestmark = pytest.mark.django_db(transaction=True)
WRITERS = 20


def race(work) -> list:  # noqa: ANN001
    barrier = threading.Barrier(WRITERS)
    outcomes: list = [None] * WRITERS

    def writer(index: int) -> None:
        try:
            barrier.wait(timeout=30)
            outcomes[index] = work(index)
        except Exception as exc:  # noqa: BLE001 - the outcome is what the test inspects
            outcomes[index] = exc
        finally:
            connection.close()

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(WRITERS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    return outcomes


def assert_one_successor(run: Run) -> None:
    run.refresh_from_db()
    sequences = list(
        Checkpoint.objects.filter(run=run).order_by("sequence").values_list("sequence", flat=True)
    )
    assert sequences == [1, 2], "the history has a gap or a fork"
    assert (run.version, run.checkpoint_sequence) == (2, 2)
    assert run_verify(tenant=run.tenant, run_id=run.id)["ok"]


def test_exactly_one_of_twenty_concurrent_commits_wins(run, bob):
    outbox_before = OutboxMessage.objects.filter(run=run).count()

    def work(index: int) -> int:
        return checkpoint_commit(
            tenant=run.tenant,
            run_id=run.id,
            request=CommitRequest(
                expected_version=1,
                state="draft_answer",
                step=f"writer-{index}",
                envelope={"control": {"reason": f"writer {index}"}},
                actor=Actor(user=bob),
            ),
        ).sequence

    outcomes = race(work)
    kinds = Counter(type(o).__name__ for o in outcomes)
    assert kinds == {"int": 1, "ConcurrentCheckpointWrite": WRITERS - 1}, outcomes
    assert all(isinstance(o, ConcurrentCheckpointWrite) or o == 2 for o in outcomes)
    assert_one_successor(run)
    assert OutboxMessage.objects.filter(run=run).count() == outbox_before + 1


def test_exactly_one_of_twenty_concurrent_http_commits_gets_201(run, bob, acme, live_server):
    _, secret = token_issue(tenant=acme, user=bob, actor=Actor.system("test"))
    body = json.dumps(
        {"expected_version": 1, "state": "draft_answer", "step": "draft", "envelope": {}}
    ).encode()

    def work(index: int) -> tuple[int, str]:
        request = urllib.request.Request(
            f"{live_server.url}/api/v1/runs/{run.id}/checkpoints",
            data=body,
            method="POST",
            headers={"Authorization": f"Bearer {secret}", "Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=60) as response:
                return response.status, json.load(response).get("code", "")
        except urllib.error.HTTPError as error:
            return error.code, json.load(error)["code"]

    outcomes = race(work)
    assert Counter(outcomes) == {
        (201, ""): 1,
        (409, "concurrent_checkpoint_write"): WRITERS - 1,
    }, outcomes
    assert_one_successor(run)
