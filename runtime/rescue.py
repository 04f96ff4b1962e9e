"""The safety net under at-least-once delivery: find active worker runs that nothing will
move any more and queue a ``run.resume`` for them.

A run needs rescue when its worker died (the lease expired), when its command was lost
(the lease is free, nothing is queued and nothing happened for a lease period), or when a
retry came due and its delayed command went missing. A rescue command carries the run's
current version, so if the original command does turn up, one of the two is a no-op.

A worker that goes on with a run in its own loop writes each step's command claimed by
itself until its lease expires (``checkpoint_commit(continues=True)``). When the worker
dies, that claim lapses with the lease: the rescue supersedes the command (marks it sent)
and queues its own, so the run gets one command, not two.
"""

from __future__ import annotations

import logging
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Exists, OuterRef, Q
from django.utils import timezone

from checkpoints.models import Execution, OutboxMessage, Run, RunStatus
from checkpoints.services import outbox

log = logging.getLogger("cairn.runtime")


def runs_rescue(*, limit: int = 500) -> int:
    """Queue a ``run.resume`` for every stranded worker run; return how many. Each run's
    message is its own transaction (published after commit)."""
    now = timezone.now()
    grace = now - timedelta(seconds=settings.CAIRN_LEASE_SECONDS)
    expired = Q(lease_expires_at__lte=now) & ~Q(lease_owner="")
    free = Q(lease_owner="") | Q(lease_expires_at__isnull=True)
    resume = OutboxMessage.objects.filter(run=OuterRef("pk"), kind="run.resume")
    lapsed = Q(claimed_until__lte=now)  # a dead worker's (or dispatcher's) claim
    unsent = Exists(resume.filter(sent_at__isnull=True).exclude(lapsed))
    recently_sent = Exists(resume.filter(sent_at__gte=grace))
    stranded = (
        # A worker that died while reconciling leaves the run ``reconciling``.
        Q(status__in=(RunStatus.RUNNING, RunStatus.RECONCILING)) & expired
        | Q(status=RunStatus.RUNNING, updated_at__lte=grace) & free & ~recently_sent
        | Q(status=RunStatus.WAITING_RETRY, next_eligible_at__lte=now) & (expired | free)
    )
    candidates = (
        Run.objects.filter(execution=Execution.WORKER)
        .filter(stranded)
        .exclude(unsent)
        .order_by("updated_at")[:limit]
    )
    count = 0
    for run in candidates:
        with transaction.atomic():
            OutboxMessage.objects.filter(
                lapsed, run=run, kind="run.resume", sent_at__isnull=True
            ).update(sent_at=now)
            outbox.outbox_enqueue(
                run=run,
                kind="run.resume",
                payload={"run_id": str(run.pk), "expected_version": run.version},
            )
        count += 1
        log.info("stranded run re-queued", extra={"run": str(run.pk), "version": run.version})
    return count
