"""The transactional outbox: commands written with the state they derive from, published
after commit, at least once.

A message is claimed with a conditional UPDATE (``WHERE sent_at IS NULL`` and no live
claim), so two dispatchers never publish one message at the same moment; a dispatcher that
dies after publishing but before marking the message sent leaves a claim that expires,
and the sweep publishes it again. Consumers treat a stale or duplicate command as a no-op.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import F, Q
from django.utils import timezone

from checkpoints.models import OutboxMessage, Run

log = logging.getLogger("cairn.outbox")

# Kinds that become a Celery task; every other kind is an event with no consumer yet.
TASK_FOR_KIND = {"run.resume": "checkpoints.run_advance"}


def outbox_enqueue(
    *, run: Run, kind: str, payload: dict[str, Any], available_at: datetime | None = None
) -> OutboxMessage:
    """Insert a message in the caller's transaction and publish it right after commit.

    An event no task consumes (``run.checkpointed`` of an externally driven run) is recorded
    as already sent: it is history for integrations, and claiming it would cost two more
    writes on every commit for nothing.
    """
    consumed = kind in TASK_FOR_KIND
    message = OutboxMessage.objects.create(
        tenant_id=run.tenant_id,
        run=run,
        kind=kind,
        payload=payload,
        available_at=available_at,
        sent_at=None if consumed else timezone.now(),
    )
    if (
        consumed
        and settings.CAIRN_DISPATCH_ON_COMMIT
        and (available_at is None or available_at <= timezone.now())
    ):
        transaction.on_commit(lambda: outbox_dispatch(message_ids=[message.id]))
    return message


def _publish(message: OutboxMessage) -> None:
    task = TASK_FOR_KIND.get(message.kind)
    if task is None:
        return
    from cairn.celery import app

    app.send_task(task, kwargs=message.payload, retry=False)


def outbox_dispatch(*, message_ids: Iterable[int] | None = None, limit: int = 200) -> int:
    """Publish due, unsent, unclaimed messages; return how many were published.

    Never raises for a broker failure: the message stays unsent for the next sweep.
    """
    now = timezone.now()
    due = (
        Q(sent_at__isnull=True)
        & (Q(available_at__isnull=True) | Q(available_at__lte=now))
        & (Q(claimed_until__isnull=True) | Q(claimed_until__lt=now))
    )
    candidates = OutboxMessage.objects.filter(due)
    if message_ids is not None:
        candidates = candidates.filter(id__in=list(message_ids))
    published = 0
    claim_until = now + timedelta(seconds=settings.CAIRN_OUTBOX_CLAIM_SECONDS)
    for message in candidates.order_by("id")[:limit]:
        claimed = OutboxMessage.objects.filter(due, id=message.id).update(
            claimed_until=claim_until, attempts=F("attempts") + 1
        )
        if claimed != 1:
            continue  # another dispatcher has it
        try:
            _publish(message)
        except Exception:
            log.exception("outbox publish failed", extra={"outbox_id": message.id})
            OutboxMessage.objects.filter(id=message.id).update(claimed_until=None)
            continue
        OutboxMessage.objects.filter(id=message.id).update(sent_at=timezone.now())
        published += 1
    return published


def outbox_lag_seconds() -> float:
    """Age of the oldest due, unsent message (0 when the outbox is drained)."""
    now = timezone.now()
    oldest = (
        OutboxMessage.objects.filter(sent_at__isnull=True)
        .filter(Q(available_at__isnull=True) | Q(available_at__lte=now))
        .order_by("id")
        .values_list("created_at", "available_at")
        .first()
    )
    if oldest is None:
        return 0.0
    created, available = oldest
    return max(0.0, (now - max(created, available or created)).total_seconds())
