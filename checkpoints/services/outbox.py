"""The transactional outbox: commands written with the state they derive from, published
after commit, at least once.

A message is claimed with a conditional UPDATE (``WHERE sent_at IS NULL`` and no live
claim), so two dispatchers never publish one message at the same moment; a dispatcher that
dies after publishing but before marking the message sent leaves a claim that expires,
and the sweep publishes it again. Consumers treat a stale or duplicate command as a no-op.

Claims and due times are compared on the database's clock (``cairn.clock``), as leases are:
a continuing worker's own command is claimed until its lease would expire, on that clock, so
a dispatcher whose clock runs fast does not publish it early, nor one whose clock runs slow
late.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from datetime import datetime
from typing import Any
from uuid import UUID

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Q
from django.utils import timezone

from checkpoints.models import OutboxMessage, Run
from telemetry.tracing import message_headers, run_context
from tenants.prepared import POSTGRES, SQLITE, Dialect, statement_fetchall

log = logging.getLogger("cairn.outbox")

# Kinds that become a Celery task; every other kind is an event with no consumer yet.
TASK_FOR_KIND = {
    "run.resume": "checkpoints.run_advance",
    # Reviewer notifications (the approvals app's tasks, named here, never imported).
    "approval.notify": "approvals.notify_plan",
    "approval.deliver": "approvals.notification_deliver",
    # A bulk action's work (runtime.services.bulk); its message names no single run.
    "bulk.process": "runtime.bulk_action_process",
}


def outbox_enqueue(
    *,
    run: Run | None,
    kind: str,
    payload: dict[str, Any],
    available_at: datetime | None = None,
    tenant_id: UUID | None = None,
) -> OutboxMessage:
    """Insert a message in the caller's transaction and publish it right after commit.

    A command about no single run (a bulk action's) has ``run`` None and names its
    ``tenant_id``.

    An event no task consumes (``run.checkpointed`` of an externally driven run) is recorded
    as already sent: it is history for integrations, and claiming it would cost two more
    writes on every commit for nothing.
    """
    consumed = kind in TASK_FOR_KIND
    message = OutboxMessage.objects.create(
        tenant_id=run.tenant_id if run is not None else tenant_id,
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

    # The run's trace goes with its command, whoever publishes it (a web request, the sweep,
    # the rescue of a dead worker's run): the worker that executes it traces into the run's
    # trace. Published in that context, the Celery instrumentation's own span joins it too.
    trace_context = getattr(message, "run_trace_context", "")
    with run_context(trace_context):
        app.send_task(
            task, kwargs=message.payload, retry=False, headers=message_headers(trace_context)
        )


_OUTBOX = OutboxMessage._meta.db_table
_RUN = Run._meta.db_table


def _due(d: Dialect) -> str:
    """Due: unsent, available, not claimed by a live dispatcher (or a live worker), and not
    a command of a run an operator paused (runtime.services.pause): those wait, unsent,
    until the run is unpaused, whichever path queued them."""
    return (
        f"sent_at IS NULL AND (available_at IS NULL OR available_at <= {d.now})"
        f" AND (claimed_until IS NULL OR claimed_until < {d.now})"
        f" AND NOT EXISTS (SELECT 1 FROM {_RUN} WHERE {_RUN}.id = {_OUTBOX}.run_id"
        f" AND {_RUN}.paused)"
    )


def _claim_statement(d: Dialect, *, named: bool) -> str:
    """The claim: one conditional UPDATE that also returns what to publish, so a
    dispatcher neither reads the message first nor can claim one another dispatcher holds.
    ``named``: the caller's ids (a JSON list on SQLite); else the sweep's oldest due ones.
    One fixed statement either way, prepared on PostgreSQL (``tenants.prepared``): every
    command published at commit is claimed with it."""
    if named:
        which = (
            f"id = ANY({d.p('ids', 'bigint[]')})"
            if d.casts
            else f"id IN (SELECT value FROM json_each({d.p('ids', 'text')}))"
        )
    else:
        which = (
            f"id IN (SELECT id FROM {_OUTBOX} WHERE {_due(d)} ORDER BY id "
            f"LIMIT {d.p('limit', 'integer')})"
        )
    return f"""
UPDATE {_OUTBOX} SET claimed_until = {d.later("seconds")}, attempts = attempts + 1
 WHERE {which} AND {_due(d)}
RETURNING id, kind, payload,
    (SELECT trace_context FROM {_RUN} WHERE {_RUN}.id = {_OUTBOX}.run_id)
"""


_CLAIM_NAMED, _CLAIM_DUE = (
    (_claim_statement(POSTGRES, named=named), _claim_statement(SQLITE, named=named))
    for named in (True, False)
)


def _mark_statement(d: Dialect, assignment: str) -> str:
    return f"UPDATE {_OUTBOX} SET {assignment} WHERE id = {d.p('id', 'bigint')} RETURNING id"


_SENT = tuple(
    _mark_statement(d, f"sent_at = {d.p('sent_at', 'timestamptz')}") for d in (POSTGRES, SQLITE)
)
_UNCLAIM = tuple(_mark_statement(d, "claimed_until = NULL") for d in (POSTGRES, SQLITE))


def _claim(message_ids: list[int] | None, *, limit: int, seconds: int) -> list[OutboxMessage]:
    """Claim the due messages among ``message_ids`` (all due ones, oldest first, when None),
    at most ``limit``, for ``seconds`` on the database's clock, each with its run's trace
    context (``run_trace_context``, not a column of the message): one statement."""
    if message_ids is None:
        statement, params = _CLAIM_DUE, {"limit": limit}
    elif not message_ids:
        return []
    else:
        ids = message_ids[:limit]
        embedded = connection.vendor != "postgresql"
        statement, params = _CLAIM_NAMED, {"ids": json.dumps(ids) if embedded else ids}
    rows = statement_fetchall(*statement, {**params, "seconds": int(seconds)})
    # PostgreSQL's driver decodes jsonb; SQLite returns the text.
    messages = []
    for pk, kind, payload, trace_context in sorted(rows):
        message = OutboxMessage(
            id=pk,
            kind=kind,
            payload=json.loads(payload) if isinstance(payload, str | bytes) else payload,
        )
        message.run_trace_context = trace_context or ""
        messages.append(message)
    return messages


def _mark(statement: tuple[str, str], **params: Any) -> None:
    statement_fetchall(*statement, params)


def outbox_dispatch(*, message_ids: Iterable[int] | None = None, limit: int = 200) -> int:
    """Publish due, unsent, unclaimed messages; return how many were published.

    Each message is claimed (one conditional UPDATE for all of them), published, then
    marked sent. Never raises for a broker failure: the message's claim is dropped and it
    stays unsent for the next sweep. A dispatcher that dies between publishing and marking
    leaves a claim that expires, and the message is published again (at least once).
    """
    ids = None if message_ids is None else list(message_ids)
    published = 0
    claimed = _claim(ids, limit=limit, seconds=settings.CAIRN_OUTBOX_CLAIM_SECONDS)
    for message in claimed:
        try:
            _publish(message)
        except Exception:
            log.exception("outbox publish failed", extra={"outbox_id": message.id})
            _mark(_UNCLAIM, id=message.id)
            continue
        sent_at = timezone.now()
        if connection.vendor != "postgresql":
            sent_at = connection.ops.adapt_datetimefield_value(sent_at)
        _mark(_SENT, id=message.id, sent_at=sent_at)
        published += 1
    return published


def outbox_lag_seconds(now: datetime | None = None) -> float:
    """Age of the oldest due, unsent message as of ``now`` (0 when the outbox is drained).
    A paused run's held commands are not lag: they wait on purpose."""
    now = now or timezone.now()
    oldest = (
        OutboxMessage.objects.filter(sent_at__isnull=True)
        .filter(Q(available_at__isnull=True) | Q(available_at__lte=now))
        .exclude(run__paused=True)
        .order_by("id")
        .values_list("created_at", "available_at")
        .first()
    )
    if oldest is None:
        return 0.0
    created, available = oldest
    return max(0.0, (now - max(created, available or created)).total_seconds())
