"""The beat tasks: the outbox sweep publishes what came due, and the rescue sweep re-queues
runs whose worker died or whose command was lost, and nothing else."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from checkpoints.models import OutboxMessage, Run, RunStatus
from checkpoints.services.outbox import outbox_enqueue
from runtime import tasks
from tests.runtime_support import start

pytestmark = pytest.mark.django_db

AGO = timedelta(minutes=5)


@pytest.fixture(autouse=True)
def _every_call_is_a_new_period(settings):  # noqa: ANN001
    # The tasks run their job through a claim that lets one run through per interval
    # (scheduling.services, tests/test_scheduling.py); these tests call them back to back.
    settings.CELERY_BEAT_SCHEDULE = {
        key: {**entry, "schedule": 0.0} for key, entry in settings.CELERY_BEAT_SCHEDULE.items()
    }


@pytest.fixture
def quiet_run(acme, settings):  # noqa: ANN001, ANN201
    """A worker run whose first command went out long ago (nothing queued now)."""
    settings.CAIRN_LEASE_SECONDS = 60
    run = start(acme, "research")
    long_ago = timezone.now() - AGO
    OutboxMessage.objects.filter(run=run).update(sent_at=long_ago)
    Run.objects.filter(pk=run.pk).update(updated_at=long_ago)
    run.refresh_from_db()
    return run


def rescued(run) -> list[dict]:  # noqa: ANN001
    return list(
        OutboxMessage.objects.filter(run=run, sent_at__isnull=True).values_list(
            "payload", flat=True
        )
    )


def test_a_run_whose_worker_died_is_queued_again_at_its_current_version(quiet_run):
    Run.objects.filter(pk=quiet_run.pk).update(
        lease_owner="dead", lease_expires_at=timezone.now() - timedelta(seconds=1)
    )
    assert tasks.runs_rescue() == 1
    assert rescued(quiet_run) == [{"run_id": str(quiet_run.pk), "expected_version": 1}]
    assert tasks.runs_rescue() == 0  # its command is queued now


def test_a_run_whose_command_was_lost_is_queued_again(quiet_run):
    assert tasks.runs_rescue() == 1


def test_a_run_with_a_live_lease_is_left_alone(quiet_run):
    Run.objects.filter(pk=quiet_run.pk).update(
        lease_owner="alive", lease_expires_at=timezone.now() + timedelta(seconds=30)
    )
    assert tasks.runs_rescue() == 0


def test_a_run_whose_command_was_just_sent_is_left_alone(quiet_run):
    OutboxMessage.objects.filter(run=quiet_run).update(sent_at=timezone.now())
    assert tasks.runs_rescue() == 0


def test_a_due_retry_is_queued_again_and_a_future_one_is_not(quiet_run):
    Run.objects.filter(pk=quiet_run.pk).update(
        status=RunStatus.WAITING_RETRY, next_eligible_at=timezone.now() + timedelta(minutes=1)
    )
    assert tasks.runs_rescue() == 0
    Run.objects.filter(pk=quiet_run.pk).update(next_eligible_at=timezone.now() - AGO)
    assert tasks.runs_rescue() == 1


@pytest.mark.parametrize(
    "change",
    [
        {"status": RunStatus.WAITING_APPROVAL},
        {"status": RunStatus.PAUSED_FOR_REVIEW},
        {"status": RunStatus.FAILED},
        {"execution": "external"},
    ],
    ids=["waiting_approval", "paused_for_review", "failed", "external"],
)
def test_runs_that_wait_for_a_person_ended_or_are_external_are_never_rescued(quiet_run, change):
    Run.objects.filter(pk=quiet_run.pk).update(**change)
    assert tasks.runs_rescue() == 0


def test_the_outbox_sweep_publishes_a_delayed_command_once_it_is_due(quiet_run):
    message = outbox_enqueue(
        run=quiet_run,
        kind="run.resume",
        payload={"run_id": str(quiet_run.pk), "expected_version": 1},
        available_at=timezone.now() + timedelta(minutes=1),
    )
    assert tasks.outbox_sweep() == 0
    OutboxMessage.objects.filter(pk=message.pk).update(available_at=timezone.now() - AGO)
    assert tasks.outbox_sweep() == 1
    message.refresh_from_db()
    assert message.sent_at is not None
    assert tasks.outbox_sweep() == 0
