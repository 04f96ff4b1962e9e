"""Bulk actions (issue 29, item 3): a dry run that counts and gives each refusal with its
reason (asked of the action's own refusal function), then the work in chunks, each run
through its own service (audited as usual), and a worker killed mid-way that resumes
without acting twice on a run."""

from __future__ import annotations

import uuid

import pytest

from cairn.errors import InvalidRequest, NotFound
from checkpoints.models import BulkAction, BulkActionRun, OutboxMessage, Run, RunStatus
from runtime.services import bulk
from runtime.services.cancel import run_cancel
from tenants.models import AuditEvent
from tenants.services import Actor
from tests.actions_support import advance, worker_run

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _no_dispatch(settings):  # noqa: ANN001
    settings.CAIRN_DISPATCH_ON_COMMIT = False


def runs(tenant, user, n: int) -> list[Run]:  # noqa: ANN001
    return [worker_run(tenant, user) for _ in range(n)]


def start(tenant, user, action: str, selected: list, **kwargs) -> BulkAction:  # noqa: ANN001
    return bulk.bulk_action_start(
        tenant=tenant,
        actor=Actor(user=user),
        action=action,
        reason=kwargs.pop("reason", "clean up the backlog"),
        run_ids=[r.pk if isinstance(r, Run) else r for r in selected],
        selection={"ticked": True},
        **kwargs,
    )


def test_a_dry_run_counts_and_gives_each_refusal_its_reason_and_changes_nothing(acme, bob):
    live = runs(acme, bob, 2)
    done = worker_run(acme, bob)
    run_cancel(tenant=acme, run_id=done.pk, reason="gone", actor=Actor(user=bob))
    before = AuditEvent.objects.count()

    plan = bulk.bulk_action_plan(
        tenant=acme, action="cancel", run_ids=[r.pk for r in [*live, done]]
    )

    assert (plan.total, len(plan.actionable), len(plan.refusals)) == (3, 2, 1)
    assert plan.refusals == [
        (str(done.pk), "The run is already cancelled; there is nothing to cancel.")
    ]
    assert AuditEvent.objects.count() == before
    assert not BulkAction.objects.exists()
    assert {r.status for r in Run.objects.filter(pk__in=[r.pk for r in live])} == {"running"}


def test_a_bulk_cancel_cancels_each_run_through_its_service_and_audits_the_bulk_action(acme, bob):
    live = runs(acme, bob, 3)
    done = worker_run(acme, bob)
    run_cancel(tenant=acme, run_id=done.pk, reason="gone", actor=Actor(user=bob))

    action = start(acme, bob, "cancel", [*live, done])
    assert (action.status, action.total, action.done, action.refused) == ("queued", 4, 0, 0)
    # Queued through the outbox, as every background command is.
    assert OutboxMessage.objects.filter(
        kind="bulk.process", payload={"bulk_action_id": str(action.pk)}, sent_at__isnull=True
    ).exists()
    event = AuditEvent.objects.get(action="runs.bulk_action")
    assert (event.reason, event.details["action"], event.details["total"]) == (
        "clean up the backlog",
        "cancel",
        4,
    )

    action = bulk.bulk_action_process(bulk_action_id=action.pk)

    assert (action.status, action.done, action.refused) == ("finished", 3, 1)
    assert action.finished_at is not None
    for run in live:
        run.refresh_from_db()
        assert run.status == RunStatus.CANCELLED
        one = AuditEvent.objects.get(action="run.cancel", run_id=run.pk)
        assert (one.reason, one.actor_label) == ("clean up the backlog", "bob")
    refused = BulkActionRun.objects.get(bulk_action=action, outcome="refused")
    assert refused.run_id == done.pk
    assert refused.detail == "The run is already cancelled; there is nothing to cancel."


def test_a_bulk_resume_resumes_what_can_be_and_refuses_the_rest(acme, bob):
    waiting = advance(worker_run(acme, bob), bob, "draft_answer", status="paused_for_review")
    running = worker_run(acme, bob)
    plan = bulk.bulk_action_plan(tenant=acme, action="resume", run_ids=[waiting.pk, running.pk])
    assert plan.actionable == [str(waiting.pk)]
    assert plan.refusals == [
        (str(running.pk), "The run is already running; there is nothing to resume.")
    ]
    action = bulk.bulk_action_process(
        bulk_action_id=start(acme, bob, "resume", [waiting, running]).pk
    )
    assert (action.done, action.refused) == (1, 1)
    waiting.refresh_from_db()
    assert waiting.status == RunStatus.RUNNING
    assert AuditEvent.objects.filter(action="run.resume", run_id=waiting.pk).count() == 1


def test_a_bulk_retry_runs_the_named_step_again_where_the_run_reached_it(acme, bob):
    there = advance(worker_run(acme, bob), bob, "draft_answer")
    fresh = worker_run(acme, bob)
    plan = bulk.bulk_action_plan(
        tenant=acme, action="retry", step="draft", run_ids=[there.pk, fresh.pk]
    )
    assert plan.actionable == [str(there.pk)]
    assert plan.refusals[0][0] == str(fresh.pk)
    assert "has not reached step draft" in plan.refusals[0][1]
    action = bulk.bulk_action_process(
        bulk_action_id=start(acme, bob, "retry", [there, fresh], step="draft").pk
    )
    assert (action.done, action.refused, action.step) == (1, 1, "draft")
    event = AuditEvent.objects.get(action="run.retry", run_id=there.pk)
    assert event.details["step"] == "draft"


def test_a_retry_needs_a_step_and_a_step_the_workflow_has(acme, bob):
    run = worker_run(acme, bob)
    with pytest.raises(InvalidRequest) as missing:
        bulk.bulk_action_plan(tenant=acme, action="retry", run_ids=[run.pk])
    assert missing.value.fields == {"step": "required for a retry"}
    plan = bulk.bulk_action_plan(tenant=acme, action="retry", step="nope", run_ids=[run.pk])
    assert "has no step 'nope'" in plan.refusals[0][1]


def test_a_bulk_pause_and_unpause(acme, bob):
    both = runs(acme, bob, 2)
    action = bulk.bulk_action_process(bulk_action_id=start(acme, bob, "pause", both).pk)
    assert (action.done, action.refused) == (2, 0)
    assert set(
        Run.objects.filter(pk__in=[r.pk for r in both]).values_list("paused", flat=True)
    ) == {True}
    again = bulk.bulk_action_plan(tenant=acme, action="pause", run_ids=[both[0].pk])
    assert again.refusals == [
        (str(both[0].pk), "The run is already paused; unpause it to let it go on.")
    ]
    action = bulk.bulk_action_process(bulk_action_id=start(acme, bob, "unpause", both).pk)
    assert (action.done, action.refused) == (2, 0)
    assert not Run.objects.filter(pk__in=[r.pk for r in both], paused=True).exists()
    assert AuditEvent.objects.filter(action="run.unpause").count() == 2


def test_another_tenants_run_is_refused_as_not_found_like_an_unknown_id(acme, bob, globex, charlie):
    mine = worker_run(acme, bob)
    theirs = worker_run(globex, charlie)
    unknown = uuid.uuid4()
    plan = bulk.bulk_action_plan(
        tenant=acme, action="cancel", run_ids=[mine.pk, theirs.pk, unknown]
    )
    assert plan.refusals == [(str(theirs.pk), "No such run."), (str(unknown), "No such run.")]
    action = bulk.bulk_action_process(
        bulk_action_id=start(acme, bob, "cancel", [mine, theirs, unknown]).pk
    )
    assert (action.done, action.refused) == (1, 2)
    theirs.refresh_from_db()
    assert theirs.status == RunStatus.RUNNING
    assert not AuditEvent.objects.filter(run_id=theirs.pk, action="run.cancel").exists()
    # Nor can the other tenant read the bulk action.
    with pytest.raises(NotFound):
        bulk.bulk_action_get(tenant=globex, bulk_action_id=action.pk)


class Crash(BaseException):
    """A worker dying mid-chunk: nothing catches it."""


def test_a_worker_killed_mid_way_resumes_without_acting_twice_on_a_run(
    acme, bob, settings, monkeypatch
):
    selected = runs(acme, bob, 5)
    action = start(acme, bob, "cancel", selected)
    calls = {"n": 0}

    def crash_at_third(point: str) -> None:
        if point == "bulk.run_acted":
            calls["n"] += 1
            if calls["n"] == 3:
                raise Crash(point)

    monkeypatch.setattr("cairn.faults._injector", lambda path: crash_at_third)
    settings.CAIRN_FAULT_INJECTOR = "crash_at_third"
    with pytest.raises(Crash):
        bulk.bulk_action_process(bulk_action_id=action.pk, chunk_size=2)
    action.refresh_from_db()
    # The third run's cancel died with its transaction: two done, nothing half-written.
    assert (action.done, action.status) == (2, "running")
    assert Run.objects.filter(pk__in=[r.pk for r in selected], status="cancelled").count() == 2

    settings.CAIRN_FAULT_INJECTOR = None
    # The claim of the dead worker has not expired: a second worker leaves it alone.
    assert bulk.bulk_action_process(bulk_action_id=action.pk).done == 2
    BulkAction.objects.filter(pk=action.pk).update(claimed_until=None)
    action = bulk.bulk_action_process(bulk_action_id=action.pk, chunk_size=2)
    assert (action.status, action.done, action.refused) == ("finished", 5, 0)
    for run in selected:
        assert AuditEvent.objects.filter(action="run.cancel", run_id=run.pk).count() == 1
    # And once finished, another delivery of its command does nothing.
    assert bulk.bulk_action_process(bulk_action_id=action.pk).done == 5
    assert AuditEvent.objects.filter(action="run.cancel").count() == 5


def test_an_abandoned_bulk_action_is_queued_again(acme, bob):
    action = start(acme, bob, "pause", runs(acme, bob, 1))
    OutboxMessage.objects.filter(kind="bulk.process").update(sent_at="2026-01-01T00:00:00Z")
    assert bulk.bulk_actions_rescue() == 1
    assert OutboxMessage.objects.filter(kind="bulk.process", sent_at__isnull=True).count() == 1
    assert bulk.bulk_actions_rescue() == 0  # its command is already queued
    bulk.bulk_action_process(bulk_action_id=action.pk)
    OutboxMessage.objects.filter(kind="bulk.process").update(sent_at="2026-01-01T00:00:00Z")
    assert bulk.bulk_actions_rescue() == 0  # finished


def test_a_reason_is_required_and_nothing_is_written_without_one(acme, bob):
    selected = runs(acme, bob, 1)
    with pytest.raises(InvalidRequest) as refused:
        start(acme, bob, "cancel", selected, reason="  ")
    assert refused.value.fields == {"reason": "required"}
    assert not BulkAction.objects.exists()


def test_a_selection_past_the_cap_is_refused_with_a_sentence(acme, bob, settings):
    settings.CAIRN_BULK_ACTION_MAX_RUNS = 2
    selected = runs(acme, bob, 3)
    with pytest.raises(InvalidRequest) as refused:
        start(acme, bob, "cancel", selected)
    assert "3 runs" in refused.value.detail and "at most 2" in refused.value.detail
    with pytest.raises(InvalidRequest):
        bulk.bulk_action_plan(tenant=acme, action="cancel", run_ids=[r.pk for r in selected])
    assert not BulkAction.objects.exists()
    with pytest.raises(InvalidRequest) as empty:
        start(acme, bob, "cancel", [])
    assert "No runs" in empty.value.detail


def test_an_unknown_action_is_refused(acme, bob):
    with pytest.raises(InvalidRequest):
        start(acme, bob, "fork", runs(acme, bob, 1))
