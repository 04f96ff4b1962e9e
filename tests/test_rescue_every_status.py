"""No run is ever stranded: for every status a command can be lost from, the command is lost
(sent, then gone with the broker; or taken by a worker that died holding the lease) and the
shipped rescue moves the run again. Every other status waits for a person or has ended, and
the first test holds the two lists to ``RunStatus``, so a new status cannot be forgotten.

The runs are the demo ``research`` workflow, carried by an in-process worker (the same
``run_advance`` a Celery worker calls) against the real publishing service. The worker tests
(``tests/test_liveness_workers.py``) lose commands to real kills and broker flushes.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from django.utils import timezone

from approvals.models import ApprovalRequest, ApprovalStatus
from checkpoints.models import ExternalOperation, Run, RunStatus
from runtime import tasks
from runtime.rescue import STRANDED
from runtime.services.cancel import run_cancel
from tenants.services import Actor
from tests.actions_support import operation
from tests.approvals_support import decide, start_demo
from tests.liveness_support import (
    LONG_AGO,
    deliver,
    die_holding_the_lease,
    lose_every_command,
    waiting,
)

pytestmark = pytest.mark.django_db

# The statuses no lost command can strand: a person moves the run on, or it has ended.
WAITS_OR_ENDED = {
    RunStatus.PAUSED_FOR_REVIEW: "an operator resumes it",
    RunStatus.FAILED: "ended (an operator may resume or retry it)",
    RunStatus.SUCCEEDED: "ended",
    RunStatus.CANCELLED: "ended",
}


@pytest.fixture(autouse=True)
def _shipped(settings, publishing_service):  # noqa: ANN001
    settings.CAIRN_LEASE_SECONDS = 60
    settings.CAIRN_PUBLISHING_URL = publishing_service.url
    # The beat's jobs run through a claim (once per interval); these tests call them in turn.
    settings.CELERY_BEAT_SCHEDULE = {
        key: {**entry, "schedule": 0.0} for key, entry in settings.CELERY_BEAT_SCHEDULE.items()
    }


def request_of(run: Run) -> ApprovalRequest:
    return ApprovalRequest.objects.get(run=run, status=ApprovalStatus.PENDING)


# Each scenario strands a run at one status and says where the rescued run must get to.
def running_command_lost(acme, bob, carol) -> tuple[Run, str]:  # noqa: ANN001
    run = start_demo(acme, bob)
    lose_every_command(run)
    return run, RunStatus.WAITING_APPROVAL


def running_worker_killed(acme, bob, carol) -> tuple[Run, str]:  # noqa: ANN001
    run = start_demo(acme, bob)
    die_holding_the_lease(run)
    return run, RunStatus.WAITING_APPROVAL


def reconciling_worker_killed(acme, bob, carol) -> tuple[Run, str]:  # noqa: ANN001
    run = start_demo(acme, bob)
    Run.objects.filter(pk=run.pk).update(status=RunStatus.RECONCILING)
    die_holding_the_lease(run)
    return run, RunStatus.WAITING_APPROVAL


def waiting_retry_command_lost(acme, bob, carol) -> tuple[Run, str]:  # noqa: ANN001
    run = start_demo(acme, bob)
    Run.objects.filter(pk=run.pk).update(
        status=RunStatus.WAITING_RETRY, next_eligible_at=timezone.now() - LONG_AGO
    )
    lose_every_command(run)
    return run, RunStatus.WAITING_APPROVAL


def approved_command_lost(acme, bob, carol) -> tuple[Run, str]:  # noqa: ANN001
    run = waiting(acme, bob)
    decide(request_of(run), carol)
    lose_every_command(run)
    return run, RunStatus.SUCCEEDED


def rejected_command_lost(acme, bob, carol) -> tuple[Run, str]:  # noqa: ANN001
    run = waiting(acme, bob)
    decide(request_of(run), carol, "reject", comment="the draft cites a blog")
    lose_every_command(run)
    return run, RunStatus.FAILED


def approved_worker_killed_at_the_gate(acme, bob, carol) -> tuple[Run, str]:  # noqa: ANN001
    run = waiting(acme, bob)
    request = request_of(run)
    decide(request, carol)
    # The gate consumed the approval; the worker died before its commit moved the run.
    ApprovalRequest.objects.filter(pk=request.pk).update(
        status=ApprovalStatus.CONSUMED, consumed_at=timezone.now()
    )
    die_holding_the_lease(run)
    return run, RunStatus.SUCCEEDED


def cancel_settlement_lost(acme, bob, carol) -> tuple[Run, str]:  # noqa: ANN001
    run = start_demo(acme, bob)
    row = operation(run, f"cairn.{run.pk}.lost-cancel.1", "reserved")
    ExternalOperation.objects.filter(pk=row.pk).update(provider="publishing")
    # The web process that took the cancel died before it asked the provider.
    run_cancel(tenant=acme, run_id=run.pk, reason="stop", actor=Actor(user=bob), settle=False)
    return run, RunStatus.CANCELLED


SCENARIOS: dict[str, tuple[str, Callable]] = {
    "running, its command lost": (RunStatus.RUNNING, running_command_lost),
    "running, its worker killed": (RunStatus.RUNNING, running_worker_killed),
    "reconciling, its worker killed": (RunStatus.RECONCILING, reconciling_worker_killed),
    "waiting_retry, due, its command lost": (RunStatus.WAITING_RETRY, waiting_retry_command_lost),
    "waiting_approval, approved, its command lost": (
        RunStatus.WAITING_APPROVAL,
        approved_command_lost,
    ),
    "waiting_approval, rejected, its command lost": (
        RunStatus.WAITING_APPROVAL,
        rejected_command_lost,
    ),
    "waiting_approval, approved, its worker killed at the gate": (
        RunStatus.WAITING_APPROVAL,
        approved_worker_killed_at_the_gate,
    ),
    "cancelling, its settlement lost": (RunStatus.CANCELLING, cancel_settlement_lost),
}


def test_every_status_is_rescued_or_waits_for_a_person_or_has_ended():
    assert set(STRANDED) | set(WAITS_OR_ENDED) == set(RunStatus)
    assert not set(STRANDED) & set(WAITS_OR_ENDED)
    assert {status for status, _ in SCENARIOS.values()} == set(STRANDED)


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_a_run_whose_command_was_lost_moves_again(scenario, acme, bob, carol, publishing_service):
    status, strand = SCENARIOS[scenario]
    run, destination = strand(acme, bob, carol)
    run.refresh_from_db()
    assert run.status == status
    for _ in range(3):  # the shipped beat jobs, then whatever they queued, to the end
        tasks.runs_rescue()
        tasks.runs_cancel_sweep()
        deliver(run)
    run.refresh_from_db()
    assert run.status == destination, run.status_reason
    assert run.lease_owner == ""
    if destination == RunStatus.SUCCEEDED:
        assert publishing_service.stats()["publications"] == 1
    # Nothing is left queued for it, and the rescue finds nothing more to do.
    assert tasks.runs_rescue() == 0
