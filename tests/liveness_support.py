"""Helpers for the liveness tests: lose a run's commands as a broker restart or a killed
worker would, and hand what is queued to an in-process worker as the broker would."""

from __future__ import annotations

from datetime import timedelta

from django.utils import timezone

from checkpoints.models import OutboxMessage, Run
from runtime.executor import run_advance
from tests.approvals_support import start_demo

LONG_AGO = timedelta(minutes=10)


def lose_every_command(run: Run) -> None:
    """Every command of the run went to the broker long ago, and the broker lost it."""
    OutboxMessage.objects.filter(run=run).update(
        sent_at=timezone.now() - LONG_AGO, claimed_until=None
    )
    Run.objects.filter(pk=run.pk).update(updated_at=timezone.now() - LONG_AGO)


def die_holding_the_lease(run: Run) -> None:
    """A worker took the run's lease (and its command with it), then was killed."""
    lose_every_command(run)
    Run.objects.filter(pk=run.pk).update(
        lease_owner="killed:1:abc", lease_expires_at=timezone.now() - timedelta(seconds=1)
    )


def deliver(run: Run) -> list[str]:
    """Hand every queued command of the run to a worker, as the broker would."""
    outcomes = []
    for message in OutboxMessage.objects.filter(
        run=run, kind="run.resume", sent_at__isnull=True
    ).order_by("id"):
        OutboxMessage.objects.filter(pk=message.pk).update(sent_at=timezone.now())
        outcomes.append(
            run_advance(
                run_id=run.pk,
                expected_version=message.payload["expected_version"],
                owner="rescuer",
            )
        )
    return outcomes


def waiting(acme, bob) -> Run:  # noqa: ANN001
    run = start_demo(acme, bob)
    assert deliver(run) == ["waiting_approval"]
    return Run.objects.get(pk=run.pk)
