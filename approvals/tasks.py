"""Celery adapter for the approval expiry sweep (scheduled in CELERY_BEAT_SCHEDULE)."""

from __future__ import annotations

from celery import shared_task

from approvals.services import approval_expire_due


@shared_task(name="approvals.expire_due", ignore_result=True)
def expire_due() -> int:
    return approval_expire_due()
