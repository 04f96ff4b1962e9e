"""The safety net under at-least-once delivery: find active worker runs that nothing will
move any more and queue a ``run.resume`` for them.

A command can be lost to a worker killed after it took the run's lease, to a broker that
restarts without its queue, to a connection refused, or to a restore from backup. Every
status a command can be lost from is covered, each by the condition that says nothing else
will move the run (``STRANDED``; a test enumerates them against ``RunStatus``):

- ``running`` or ``reconciling`` whose worker died: its lease expired;
- ``running`` whose command was lost: the lease is free, nothing is queued, and nothing
  happened for a lease period (an operator's resume or grant queues a command like this);
- ``waiting_retry`` whose retry came due and whose delayed command went missing;
- ``waiting_approval`` whose request is decided (approved, rejected, or consumed by a
  worker that died before its commit) but not yet acted on: the decision's command was lost,
  or the worker that took it died at the gate;
- ``cancelling`` has no command: the cancel sweep (``runs_cancel_sweep``) settles it.

The rest wait for a person (``paused_for_review``, ``waiting_approval`` with a pending
request) or have ended. A rescue command carries the run's current version, so if the
original command does turn up, one of the two is a no-op.

A worker that goes on with a run in its own loop writes each step's command claimed by
itself until its lease expires (``checkpoint_commit`` with a ``WorkerLoop``). When the worker
dies, that claim lapses with the lease: the rescue supersedes the command (marks it sent)
and queues its own, so the run gets one command, not two.

**Dead workers** are not waited for: ``runs_rescue_dead_workers`` (every second on the
beat) ends the leases of workers whose heartbeat stopped (``runtime.heartbeats``) and
re-queues their runs at once, so a killed worker's run goes on within seconds, not after
its lease. Every time here is the database's (``cairn.clock``).
"""

from __future__ import annotations

import logging
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Exists, OuterRef, Q
from django.db.models.functions import Now

from checkpoints.approvals_port import approvals_port
from checkpoints.models import Execution, OutboxMessage, Run, RunStatus
from checkpoints.services import outbox

from .heartbeats import heartbeat_steady_for, workers_dead

log = logging.getLogger("cairn.runtime")

# Statuses a worker carries a run through; a worker that dies holds the lease in any of them.
LEASED_STATUSES = (
    RunStatus.RUNNING,
    RunStatus.RECONCILING,
    RunStatus.WAITING_APPROVAL,
    RunStatus.WAITING_RETRY,
)
# What the rescue does for each status a command can be lost from (docs/design.md,
# "Dispatch and the worker loop"); every other status waits for a person or has ended.
STRANDED = {
    RunStatus.RUNNING: "its worker died (lease expired), or its command was lost",
    RunStatus.RECONCILING: "its worker died while reconciling (lease expired)",
    RunStatus.WAITING_RETRY: "its retry came due and the delayed command was lost",
    RunStatus.WAITING_APPROVAL: "its request was decided and the decision's command was lost",
    RunStatus.CANCELLING: "no command: the cancel sweep settles it",
}


def runs_rescue(*, limit: int = 500) -> int:
    """Queue a ``run.resume`` for every stranded worker run; return how many. Each run's
    message is its own transaction (published after commit)."""
    grace = timedelta(seconds=settings.CAIRN_LEASE_SECONDS)
    expired = Q(lease_expires_at__lte=Now()) & ~Q(lease_owner="")
    free = Q(lease_owner="") | Q(lease_expires_at__isnull=True)
    resume = OutboxMessage.objects.filter(run=OuterRef("pk"), kind="run.resume")
    lapsed = Q(claimed_until__lte=Now())  # a dead worker's (or dispatcher's) claim
    unsent = Exists(resume.filter(sent_at__isnull=True).exclude(lapsed))
    recently_sent = Exists(resume.filter(sent_at__gte=Now() - grace))
    stranded = (
        # A worker that died holding the lease, at any status it carries a run through (the
        # approval gate included: it may have consumed the approval before dying).
        Q(status__in=(RunStatus.RUNNING, RunStatus.RECONCILING, RunStatus.WAITING_APPROVAL))
        & expired
        | Q(status=RunStatus.RUNNING, updated_at__lte=Now() - grace) & free & ~recently_sent
        | Q(status=RunStatus.WAITING_RETRY, next_eligible_at__lte=Now()) & (expired | free)
    )
    # A paused run is not stranded: it waits for an operator (runtime.services.pause).
    workers = Run.objects.filter(execution=Execution.WORKER, paused=False).exclude(unsent)
    candidates = list(workers.filter(stranded).order_by("updated_at")[:limit])
    # A decision no worker acted on: the approvals app says which waiting runs have one.
    waiting = workers.filter(status=RunStatus.WAITING_APPROVAL).filter(free).exclude(recently_sent)
    decided = approvals_port().runs_with_unused_decision(runs=waiting)
    seen = {run.pk for run in candidates}
    candidates += [run for run in decided.order_by("updated_at")[:limit] if run.pk not in seen]
    count = 0
    for run in candidates:
        _requeue(run, why="stranded run re-queued")
        count += 1
    return count


def runs_rescue_dead_workers(*, limit: int = 500) -> int:
    """End the leases of workers whose heartbeat stopped and queue their runs again; return
    how many runs. One statement when no worker is dead (the usual case).

    Only while this process's own heartbeat has reached the database steadily for
    ``CAIRN_WORKER_DEAD_SECONDS`` (``heartbeat_steady_for``): right after the database was
    away every beat is old, the live workers' too, and nobody is called dead for that."""
    if heartbeat_steady_for() < settings.CAIRN_WORKER_DEAD_SECONDS:
        return 0
    dead = workers_dead()
    if not dead:
        return 0
    held = (
        Run.objects.filter(
            execution=Execution.WORKER,
            lease_owner__in=dead,
            lease_expires_at__gt=Now(),
            status__in=LEASED_STATUSES,
        )
        .exclude(lease_owner="")  # the partial index's condition (run_leased_idx)
        .order_by("updated_at")[:limit]
    )
    count = 0
    for run in held:
        count += run_lease_end(run=run, owner=run.lease_owner, why="run of a dead worker re-queued")
    return count


def run_lease_end(*, run: Run, owner: str, why: str) -> bool:
    """End ``owner``'s lease of the run now (on the database's clock) and queue the run
    again at its version, in one transaction: for a worker that is dead, or that lost the
    database in the middle of a task. The claim on the command it was carrying out itself
    ends with the lease, so the run gets one command. The next worker's lease is a take-over
    (a restore). Returns False, writing nothing, when ``owner`` no longer holds it."""
    with transaction.atomic():
        ended = Run.objects.filter(pk=run.pk, lease_owner=owner, status__in=LEASED_STATUSES)
        if not ended.update(lease_expires_at=Now()):
            return False
        OutboxMessage.objects.filter(
            run=run, kind="run.resume", sent_at__isnull=True, claimed_until__gt=Now()
        ).update(claimed_until=Now())
        run = Run.objects.get(pk=run.pk)  # its version now, under the same transaction
        _requeue(run, why=why)
    return True


def _requeue(run: Run, *, why: str) -> None:
    """Supersede the run's lapsed commands and queue one at its current version, in one
    transaction."""
    with transaction.atomic():
        OutboxMessage.objects.filter(
            run=run, kind="run.resume", sent_at__isnull=True, claimed_until__lte=Now()
        ).update(sent_at=Now())
        outbox.outbox_enqueue(
            run=run,
            kind="run.resume",
            payload={"run_id": str(run.pk), "expected_version": run.version},
        )
    log.info(
        why,
        extra={
            "run": str(run.pk),
            "version": run.version,
            "status": run.status,
            "lease_owner": run.lease_owner,
        },
    )
