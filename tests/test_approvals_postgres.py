"""Races on real PostgreSQL: concurrent decisions and concurrent uses of one approval."""

from __future__ import annotations

import threading

import pytest
from django.db import connection

from approvals.models import ApprovalDecision, ApprovalStatus
from approvals.services import approval_consume
from cairn.errors import CairnError
from checkpoints.models import OutboxMessage
from tenants.services import Actor
from tests.approvals_support import ask, at_review, decide, draft, worker_run

pytestmark = pytest.mark.postgres


def race(*calls) -> list[object]:  # noqa: ANN002
    """Run the calls at the same moment in threads; return each result or CairnError."""
    barrier = threading.Barrier(len(calls))
    results: list[object] = [None] * len(calls)

    def run(index: int, call) -> None:  # noqa: ANN001
        try:
            barrier.wait()
            results[index] = call()
        except CairnError as exc:
            results[index] = exc
        finally:
            connection.close()

    threads = [threading.Thread(target=run, args=(i, c)) for i, c in enumerate(calls)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results


def decide_as(request, user):  # noqa: ANN001, ANN201
    return lambda: decide(request, user)


def test_two_reviewers_approving_at_once_settle_the_request_once(
    postgres_only, acme, bob, carol, alice
):
    run = at_review(worker_run(acme, bob), draft(acme))
    request = ask(run, draft(acme), bob)
    resumes_before = OutboxMessage.objects.filter(run=run, kind="run.resume").count()
    results = race(decide_as(request, carol), decide_as(request, alice))
    errors = [r for r in results if isinstance(r, CairnError)]
    assert len(errors) == 1 and errors[0].code == "approval_closed"
    assert ApprovalDecision.objects.filter(request=request).count() == 1
    request.refresh_from_db()
    assert request.status == ApprovalStatus.APPROVED
    assert OutboxMessage.objects.filter(run=run, kind="run.resume").count() == resumes_before + 1


def test_one_reviewer_in_two_tabs_decides_once(postgres_only, acme, run, bob, carol):
    run = at_review(run, draft(acme))
    request = ask(run, draft(acme), bob, required_approvals=2)
    results = race(decide_as(request, carol), decide_as(request, carol))
    errors = [r for r in results if isinstance(r, CairnError)]
    assert len(errors) == 1 and errors[0].code == "already_decided"
    assert ApprovalDecision.objects.filter(request=request, approver=carol).count() == 1


def test_an_approval_used_by_two_workers_at_once_is_consumed_once(
    postgres_only, acme, run, bob, carol
):
    run = at_review(run, draft(acme))
    request = ask(run, draft(acme), bob)
    decide_as(request, carol)()
    run.refresh_from_db()

    def use():  # noqa: ANN202
        return approval_consume(
            run=run,
            request_id=request.pk,
            action="publish",
            artifact_sha256=request.artifact_sha256,
            actor=Actor.system("worker"),
        )

    results = race(use, use, use)
    used = [r for r in results if not isinstance(r, CairnError)]
    assert len(used) == 1
    assert all(r.code == "approval_closed" for r in results if isinstance(r, CairnError))
    request.refresh_from_db()
    assert request.status == ApprovalStatus.CONSUMED
