"""Celery adapter for the approval expiry sweep (scheduled in CELERY_BEAT_SCHEDULE)."""

from __future__ import annotations

from celery import shared_task

from approvals.services import approval_expire_due
from runtime.heartbeats import heartbeat_start
from scheduling.services import periodic_job_run


@shared_task(name="approvals.expire_due", ignore_result=True)
def expire_due() -> int | None:
    """Claimed so two schedulers expire once per interval (None when skipped)."""
    return periodic_job_run(
        name="approvals.expire_due", job=approval_expire_due, holder=heartbeat_start()
    )
