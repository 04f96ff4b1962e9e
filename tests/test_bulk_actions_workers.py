"""A bulk action whose worker is SIGKILLed in the middle of its runs (issue 29, item 3): the
run being acted on is left untouched (its action and its outcome were one transaction), the
runs before it stay done, and a second worker, given the command again by the rescue once
the dead worker's claim expired, finishes the rest without acting twice on any run."""

from __future__ import annotations

import pytest

from checkpoints.models import BulkAction, Run, RunStatus
from runtime.services.bulk import bulk_action_start, bulk_actions_rescue
from runtime.services.runs import run_create
from tenants.models import AuditEvent
from tenants.services import Actor
from tests.faults import CRASH_AT, CRASH_MARKER, CRASH_SKIP
from tests.worker_fixtures import wait_for

pytestmark = [pytest.mark.worker, pytest.mark.django_db(transaction=True)]
CLAIM = 2


def test_a_killed_bulk_worker_is_replaced_and_no_run_is_cancelled_twice(
    acme, bob, workflow, worker_factory, tmp_path, settings
):
    settings.CAIRN_BULK_ACTION_CLAIM_SECONDS = CLAIM
    actor = Actor(user=bob)
    runs = [
        run_create(
            tenant=acme,
            workflow_type="research",
            inputs={"question": f"q{i}"},
            execution="external",
            actor=actor,
        )
        for i in range(6)
    ]
    marker = tmp_path / "crashed"
    first = worker_factory(
        "w1",
        env={
            CRASH_AT: "bulk.run_acted",
            CRASH_SKIP: "2",  # two runs done, killed at the third before it commits
            CRASH_MARKER: str(marker),
            "CAIRN_BULK_ACTION_CLAIM_SECONDS": str(CLAIM),
        },
    )
    bulk = bulk_action_start(
        tenant=acme,
        actor=actor,
        action="cancel",
        reason="stop them",
        run_ids=[r.pk for r in runs],
        selection={"ticked": True},
    )
    wait_for(lambda: marker.exists() and not first.alive, what="the worker to die mid-way")
    bulk.refresh_from_db()
    assert (bulk.status, bulk.done, bulk.refused) == ("running", 2, 0)
    ids = [r.pk for r in runs]
    assert Run.objects.filter(pk__in=ids, status=RunStatus.CANCELLED).count() == 2
    assert AuditEvent.objects.filter(action="run.cancel").count() == 2

    worker_factory("w2", env={"CAIRN_BULK_ACTION_CLAIM_SECONDS": str(CLAIM)})
    # The rescue leaves it alone while the dead worker's claim lasts, then queues it again.
    wait_for(lambda: bulk_actions_rescue() == 1, what="the claim to expire and the rescue")
    wait_for(
        lambda: BulkAction.objects.filter(pk=bulk.pk, status="finished").exists(),
        what="the second worker to finish the bulk action",
    )
    bulk.refresh_from_db()
    assert (bulk.done, bulk.refused) == (6, 0)
    assert Run.objects.filter(pk__in=ids, status=RunStatus.CANCELLED).count() == 6
    for pk in ids:
        assert AuditEvent.objects.filter(action="run.cancel", run_id=pk).count() == 1
