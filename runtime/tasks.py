"""Celery tasks: thin adapters over the runtime and outbox services (JSON arguments only).

Scheduled tasks run their job through a claim (scheduling.services), so any number of
``celery beat`` processes start each job once per interval; a skipped run returns None.
Every task starts this process's heartbeat (runtime.heartbeats) if it is not beating yet."""

from __future__ import annotations

from celery import shared_task

from checkpoints.services.outbox import outbox_dispatch
from runtime.executor import run_advance as _run_advance
from runtime.heartbeats import heartbeat_start
from runtime.rescue import runs_rescue as _runs_rescue
from runtime.rescue import runs_rescue_dead_workers as _runs_rescue_dead_workers
from scheduling.services import periodic_job_run


@shared_task(name="checkpoints.run_advance", acks_late=True, ignore_result=True)
def run_advance(run_id: str, expected_version: int) -> str:
    """Carry out a ``run.resume`` command (stale and duplicate commands are no-ops)."""
    return _run_advance(run_id=run_id, expected_version=int(expected_version))


@shared_task(name="checkpoints.outbox_sweep", ignore_result=True)
def outbox_sweep() -> int | None:
    """Publish due outbox messages that were not published at commit (or came due)."""
    owner = heartbeat_start()
    return periodic_job_run(name="checkpoints.outbox_sweep", job=outbox_dispatch, holder=owner)


@shared_task(name="checkpoints.runs_rescue", ignore_result=True)
def runs_rescue() -> int | None:
    """Re-queue runs whose worker died or whose command was lost."""
    return periodic_job_run(
        name="checkpoints.runs_rescue", job=_runs_rescue, holder=heartbeat_start()
    )


@shared_task(name="checkpoints.runs_rescue_dead_workers", ignore_result=True)
def runs_rescue_dead_workers() -> int | None:
    """Take over the runs of workers whose heartbeat stopped, without waiting for leases."""
    return periodic_job_run(
        name="checkpoints.runs_rescue_dead_workers",
        job=_runs_rescue_dead_workers,
        holder=heartbeat_start(),
    )


@shared_task(name="checkpoints.runs_cancel_sweep", ignore_result=True)
def runs_cancel_sweep() -> int | None:
    """Settle the open operations of cancelling runs and finish their cancels."""
    from runtime.services.cancel import runs_cancel_sweep as _runs_cancel_sweep

    return periodic_job_run(
        name="checkpoints.runs_cancel_sweep", job=_runs_cancel_sweep, holder=heartbeat_start()
    )


@shared_task(name="checkpoints.webhooks_deliver", ignore_result=True)
def webhooks_deliver() -> int | None:
    """Send due runner webhook deliveries (signed; failures retried with backoff)."""
    from runtime.services.webhooks import webhooks_deliver as _webhooks_deliver

    return periodic_job_run(
        name="checkpoints.webhooks_deliver", job=_webhooks_deliver, holder=heartbeat_start()
    )


@shared_task(name="runtime.bulk_action_process", acks_late=True, ignore_result=True)
def bulk_action_process(bulk_action_id: str) -> int:
    """Carry out a ``bulk.process`` command: work through a bulk action's pending runs (a
    finished action, or one another worker holds, is a no-op). Returns how many runs are
    recorded done so far."""
    from runtime.services.bulk import bulk_action_process as _bulk_action_process

    heartbeat_start()
    return _bulk_action_process(bulk_action_id=bulk_action_id).done


@shared_task(name="runtime.bulk_actions_rescue", ignore_result=True)
def bulk_actions_rescue() -> int | None:
    """Queue again the bulk actions whose worker died or whose command was lost."""
    from runtime.services.bulk import bulk_actions_rescue as _bulk_actions_rescue

    return periodic_job_run(
        name="runtime.bulk_actions_rescue", job=_bulk_actions_rescue, holder=heartbeat_start()
    )
