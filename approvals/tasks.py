"""Celery adapters: the approval expiry sweep (scheduled in CELERY_BEAT_SCHEDULE) and the
reviewer notifications the outbox publishes (``approvals.notify``)."""

from __future__ import annotations

from celery import shared_task

from approvals.notify import (
    notification_deliver,
    notifications_plan,
    notifications_remind_due,
)
from approvals.services import approval_expire_due
from runtime.heartbeats import heartbeat_start
from scheduling.services import periodic_job_run


def _expire_and_remind() -> int:
    expired = approval_expire_due()
    notifications_remind_due()  # and tell the reviewers of those about to expire, once
    return expired


@shared_task(name="approvals.expire_due", ignore_result=True)
def expire_due() -> int | None:
    """Claimed so two schedulers expire once per interval (None when skipped)."""
    return periodic_job_run(
        name="approvals.expire_due", job=_expire_and_remind, holder=heartbeat_start()
    )


@shared_task(name="approvals.notify_plan", acks_late=True, ignore_result=True)
def notify_plan(request_id: str, event: str = "requested") -> int:
    """The outbox's ``approval.notify``: who is told about a request, on which channel."""
    return notifications_plan(request_id=request_id, event=event)


@shared_task(name="approvals.notification_deliver", acks_late=True, ignore_result=True)
def notify_deliver(notification_id: str) -> str:
    """The outbox's ``approval.deliver``: send one notification, at most once."""
    return notification_deliver(notification_id=notification_id)
