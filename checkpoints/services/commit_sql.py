"""The SQL of the checkpoint commit: the one module that writes a checkpoint.

``checkpoint_commit`` (``checkpoints.services.checkpoints``) decides and seals; this module
reads the run's head and writes the commit. It is SQL on purpose: the commit is the hot
path of every run, and Django building and compiling four ORM statements cost more than
the database did (docs/performance.md). Everything else uses the ORM.

PostgreSQL: the commit is **one statement**, data-modifying CTEs that make the optimistic
``UPDATE run … WHERE id AND version … RETURNING``, insert the checkpoint and the outbox
message from what the update returned, and mark the caller's previous in-loop command as
consumed. When the run is not at the head the caller built the envelope from, the update
matches no row, the inserts select from nothing, and nothing is written. Outside a
transaction it is one round trip (an implicit transaction); it runs on a server-side
prepared statement (psycopg 3), parsed once per connection.

SQLite (in process, no round trips): the same protocol as plain statements in one
transaction (the settings open transactions ``IMMEDIATE``); sqlite3 keeps them prepared.

The head check covers more than the version: the run's status, its budget usage and limits
(which a lease's charge or a grant change without a new version) and the lease. So an
envelope whose budgets or identity were built from anything but the run as it is now
cannot be written. It is also the integrity check of every writer (``_HEAD_INTACT``): the
run's row must link to the chain the new checkpoint links to and agree with its head
checkpoint's row, so a tampered head is refused in the statement, without opening the
sealed envelope (``head_read`` names the disagreement: IntegrityFailure).

The PostgreSQL statement also sends ``NOTIFY`` for an externally driven run, delivered
when its transaction commits: a runner long-polling the run wakes (``changes``).

The lease clause runs on the database's clock (``cairn.clock``): whether another writer's
lease has expired is ``lease_expires_at <= statement_timestamp()`` (SQLite: its ``'now'``),
and a renewed lease, like the claim on the command a continuing worker takes, expires
``lease_seconds`` after the statement's own time, never after the writer's.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from uuid import UUID

import psycopg
from django.db import connection, transaction
from django.utils.dateparse import parse_datetime

from checkpoints.models import Checkpoint, OutboxMessage, Run, WorkflowDefinition
from checkpoints.services.changes import CHANNEL

RUN = Run._meta.db_table
CHECKPOINT = Checkpoint._meta.db_table
OUTBOX = OutboxMessage._meta.db_table
WORKFLOW = WorkflowDefinition._meta.db_table
# psycopg prepares a statement after this many executions; Django leaves it off (None) for
# connection poolers, so the commit asks for preparation itself (``prepare=True``), and the
# threshold only has to be set for psycopg to honour that.
_NEVER_AUTO_PREPARE = 2**31 - 1


@dataclass(frozen=True)
class RunHead:
    """What a commit needs from its run: identity, head of the chain, usage, lease.

    A caller that already holds it (the worker, from its restore and its last commit)
    passes it to ``checkpoint_commit``; otherwise the commit reads it (``head_read``). The
    commit's statement verifies it, so a stale head writes nothing.
    """

    id: UUID
    tenant_id: UUID
    workflow_id: int
    workflow_type: str
    workflow_version: str
    definition: dict[str, Any]
    execution: str
    version: int
    status: str
    state: str
    checkpoint_sequence: int
    latest_checkpoint_id: UUID | None
    latest_checkpoint_sha256: str
    lease_owner: str
    lease_expires_at: datetime | None
    budget_used: dict[str, Any]
    budget_limits: dict[str, Any]
    # Set by ``head_read`` when the run's row and its head checkpoint's row disagree (a row
    # altered after it was written): a sentence naming the columns. No commit follows it.
    integrity_problem: str | None = None

    @classmethod
    def of(cls, run: Run) -> RunHead:
        """The head of a run loaded with its workflow (``select_related("workflow")``)."""
        return cls(
            id=run.id,
            tenant_id=run.tenant_id,
            workflow_id=run.workflow_id,
            workflow_type=run.workflow_type,
            workflow_version=run.workflow_version,
            definition=run.workflow.definition,
            execution=run.execution,
            version=run.version,
            status=run.status,
            state=run.state,
            checkpoint_sequence=run.checkpoint_sequence,
            latest_checkpoint_id=run.latest_checkpoint_id,
            latest_checkpoint_sha256=run.latest_checkpoint_sha256,
            lease_owner=run.lease_owner,
            lease_expires_at=run.lease_expires_at,
            budget_used=dict(run.budget_used or {}),
            budget_limits=dict(run.budget_limits or {}),
        )

    def lease_held(self, now: datetime) -> bool:
        expires = self.lease_expires_at
        return bool(self.lease_owner and expires and expires > now)


@dataclass(frozen=True)
class CommitWrite:
    """One commit, decided and sealed: the values of the statement."""

    head: RunHead
    checkpoint_id: UUID
    sequence: int
    parent_id: UUID | None
    state: str
    step: str
    status: str
    status_reason: str
    next_eligible_at: datetime | None
    budget_used: dict[str, Any]
    lease_owner: str | None
    # Renew the writer's own lease to this many seconds after the statement, on the
    # database's clock (None: leave it).
    lease_seconds: int | None
    lease_release: bool  # the writer's last commit of its task: its lease ends with it
    schema_version: int
    envelope_sealed: str
    key_id: str
    sha256: str
    parent_sha256: str
    actor: str
    is_evidence: bool
    outbox_kind: str
    outbox_payload: dict[str, Any]
    outbox_available_at: datetime | None
    # The command is claimed by the writer for this many seconds on the database's clock
    # (a continuing worker's own next command), None: unclaimed.
    outbox_claim_seconds: int | None
    outbox_sent_at: datetime | None
    consumed_outbox_id: int | None  # the caller's previous in-loop command, now done
    now: datetime


def _json(value: Any) -> str:
    return json.dumps(value)


def _loads(value: Any) -> Any:
    return json.loads(value) if isinstance(value, str | bytes) else value


# What a commit reads of its run (RunHead's fields, in order), then the run's step and its
# head checkpoint's row (id, sha256, sequence, state, step) for the integrity check; each
# database names its own placeholders for the run and the tenant.
_HEAD_SELECT = f"""
SELECT r.id, r.tenant_id, r.workflow_id, r.workflow_type, r.workflow_version, w.definition,
       r.execution, r.version, r.status, r.state, r.checkpoint_sequence,
       r.latest_checkpoint_id, r.latest_checkpoint_sha256, r.lease_owner, r.lease_expires_at,
       r.budget_used, r.budget_limits,
       r.step, c.id, c.sha256, c.sequence, c.state, c.step
  FROM {RUN} r JOIN {WORKFLOW} w ON w.id = r.workflow_id
  LEFT JOIN {CHECKPOINT} c ON c.id = r.latest_checkpoint_id AND c.run_id = r.id
 WHERE r.id = {{run_id}} AND r.tenant_id = {{tenant_id}}
"""

# The integrity check every commit makes in its own statement, on the run's row as it is
# when written (``{run}`` names the run table in the UPDATE): the row links to the chain
# the commit links to (parent id, parent hash, sequence, state the commit was decided on),
# and the head checkpoint's row, which the sealed envelope was hashed with, says the same
# position (id, hash, sequence, state, step). No decryption: a run row moved without a
# checkpoint, or a checkpoint row altered, disagree here. (Both rows altered alike is
# found by ``run_verify`` and a worker's restore, which open the envelope.) The head is
# looked up by the parent id the commit names, a primary-key probe: correlated only
# through the run's columns, PostgreSQL may hash the whole checkpoint table instead.
_HEAD_INTACT = """
       AND latest_checkpoint_sha256 = {parent_sha256} AND checkpoint_sequence = {sequence} - 1
       AND state = {head_state}
       AND (CASE WHEN latest_checkpoint_id IS NULL
                 THEN {parent_id} IS NULL AND checkpoint_sequence = 0
                 ELSE latest_checkpoint_id = {parent_id} AND EXISTS (
                     SELECT 1 FROM {checkpoint} c
                      WHERE c.id = {parent_id} AND c.run_id = {run}.id
                        AND c.sha256 = {run}.latest_checkpoint_sha256
                        AND c.sequence = {run}.checkpoint_sequence
                        AND c.state = {run}.state AND c.step = {run}.step) END)
"""

# --- PostgreSQL -------------------------------------------------------------------------------
_PG_HEAD = _HEAD_SELECT.format(run_id="%(run_id)s::uuid", tenant_id="%(tenant_id)s::uuid")
_PG_HEAD_INTACT = _HEAD_INTACT.format(
    parent_sha256="%(parent_sha256)s::text",
    sequence="%(sequence)s::bigint",
    head_state="%(head_state)s::text",
    parent_id="%(parent_id)s::uuid",
    checkpoint=CHECKPOINT,
    run=RUN,
)

# ``notified``: runners long-poll externally driven runs (GET /runs/{id}/next); NOTIFY
# wakes them when this transaction commits (``checkpoints.services.changes``).
_PG_COMMIT = f"""
WITH moved AS (
    UPDATE {RUN} SET
        version = version + 1,
        checkpoint_sequence = %(sequence)s::bigint,
        latest_checkpoint_id = %(checkpoint_id)s::uuid,
        latest_checkpoint_sha256 = %(sha256)s::text,
        state = %(state)s::text,
        step = %(step)s::text,
        status = %(status)s::text,
        status_reason = %(status_reason)s::text,
        next_eligible_at = %(next_eligible_at)s::timestamptz,
        budget_used = %(budget_used)s::jsonb,
        lease_owner = CASE
            WHEN %(lease_release)s::boolean AND lease_owner = %(lease_owner)s::text
            THEN '' ELSE lease_owner END,
        lease_expires_at = CASE
            WHEN %(lease_release)s::boolean AND lease_owner = %(lease_owner)s::text THEN NULL
            WHEN %(lease_seconds)s::integer IS NOT NULL AND lease_owner = %(lease_owner)s::text
            THEN statement_timestamp() + %(lease_seconds)s::integer * interval '1 second'
            ELSE lease_expires_at END,
        updated_at = %(now)s::timestamptz
     WHERE id = %(run_id)s::uuid
       AND tenant_id = %(tenant_id)s::uuid
       AND version = %(expected_version)s::bigint
       AND status = %(head_status)s::text
       AND budget_used = %(head_used)s::jsonb
       AND budget_limits = %(head_limits)s::jsonb
       AND (lease_owner = '' OR lease_expires_at IS NULL
            OR lease_expires_at <= statement_timestamp() OR lease_owner = %(lease_owner)s::text)
       {_PG_HEAD_INTACT}
    RETURNING id, tenant_id, execution
), notified AS (
    SELECT pg_notify('{CHANNEL}', id::text) FROM moved WHERE execution = 'external'
), inserted AS (
    INSERT INTO {CHECKPOINT} (id, tenant_id, run_id, sequence, parent_id, state, step,
        schema_version, envelope_sealed, key_id, sha256, parent_sha256, actor, is_evidence,
        created_at)
    SELECT %(checkpoint_id)s::uuid, tenant_id, id, %(sequence)s::bigint, %(parent_id)s::uuid,
        %(state)s::text, %(step)s::text, %(schema_version)s::integer,
        %(envelope_sealed)s::text, %(key_id)s::text, %(sha256)s::text,
        %(parent_sha256)s::text, %(actor)s::text, %(is_evidence)s::boolean,
        %(now)s::timestamptz
      FROM moved
    RETURNING id
), queued AS (
    INSERT INTO {OUTBOX} (tenant_id, run_id, kind, payload, created_at, available_at,
        claimed_until, sent_at, attempts)
    SELECT tenant_id, id, %(outbox_kind)s::text, %(outbox_payload)s::jsonb,
        %(now)s::timestamptz, %(outbox_available_at)s::timestamptz,
        statement_timestamp() + %(outbox_claim_seconds)s::integer * interval '1 second',
        %(outbox_sent_at)s::timestamptz, 0
      FROM moved
    RETURNING id
), consumed AS (
    UPDATE {OUTBOX} SET sent_at = %(now)s::timestamptz
     WHERE id = %(consumed_outbox_id)s::bigint AND sent_at IS NULL
       AND EXISTS (SELECT 1 FROM moved)
    RETURNING id
)
SELECT (SELECT id FROM queued), (SELECT count(*) FROM inserted), (SELECT count(*) FROM consumed),
       (SELECT count(*) FROM notified)
"""


class _PreparedCursor(psycopg.Cursor):
    """Server-side binding, and every statement prepared on first use (then reused)."""

    def execute(self, query, params=None, *, prepare=None, binary=None):  # noqa: ANN001, ANN201
        return super().execute(query, params, prepare=True, binary=binary)


def _pg_execute(sql: str, params: dict[str, Any]) -> tuple | None:
    """Run one statement on a prepared-statement cursor of Django's connection (its error
    translation and execute wrappers apply) and return its one row. Logged like Django's
    own queries when queries are logged (debug, CaptureQueriesContext): psycopg keeps no
    query text for a prepared execution, so Django's debug cursor would log None."""
    connection.close_if_health_check_failed()
    connection.ensure_connection()
    raw = connection.connection
    if raw.prepare_threshold is None:
        raw.prepare_threshold = _NEVER_AUTO_PREPARE
    started = time.monotonic()
    with connection.wrap_database_errors:
        cursor = connection.make_cursor(_PreparedCursor(raw))
    with cursor:
        cursor.execute(sql, params)
        row = cursor.fetchone()
    if connection.queries_logged:
        connection.queries_log.append(
            {"sql": " ".join(sql.split()), "time": f"{time.monotonic() - started:.3f}"}
        )
    return row


def _pg_params(write: CommitWrite) -> dict[str, Any]:
    head = write.head
    return {
        "run_id": head.id,
        "tenant_id": head.tenant_id,
        "expected_version": head.version,
        "head_status": head.status,
        "head_used": _json(head.budget_used),
        "head_limits": _json(head.budget_limits),
        "head_state": head.state,
        "sequence": write.sequence,
        "checkpoint_id": write.checkpoint_id,
        "parent_id": write.parent_id,
        "sha256": write.sha256,
        "parent_sha256": write.parent_sha256,
        "state": write.state,
        "step": write.step,
        "status": write.status,
        "status_reason": write.status_reason,
        "next_eligible_at": write.next_eligible_at,
        "budget_used": _json(write.budget_used),
        "lease_owner": write.lease_owner,
        "lease_seconds": write.lease_seconds,
        "lease_release": write.lease_release,
        "schema_version": write.schema_version,
        "envelope_sealed": write.envelope_sealed,
        "key_id": write.key_id,
        "actor": write.actor,
        "is_evidence": write.is_evidence,
        "outbox_kind": write.outbox_kind,
        "outbox_payload": _json(write.outbox_payload),
        "outbox_available_at": write.outbox_available_at,
        "outbox_claim_seconds": write.outbox_claim_seconds,
        "outbox_sent_at": write.outbox_sent_at,
        "consumed_outbox_id": write.consumed_outbox_id,
        "now": write.now,
    }


# --- SQLite -----------------------------------------------------------------------------------
# The database's clock, as Django writes a datetime ('now' is this machine's: SQLite is
# embedded, so the one machine's clock is the database's). ``_SQLITE_LATER`` adds seconds.
_SQLITE_NOW = "strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now')"
_SQLITE_LATER = "strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now', '+' || %s || ' seconds')"
_SQLITE_HEAD = _HEAD_SELECT.format(run_id="%s", tenant_id="%s")
# Its placeholders, in order: parent hash, sequence, head state, parent id (three times).
_SQLITE_HEAD_INTACT = _HEAD_INTACT.format(
    parent_sha256="%s",
    sequence="%s",
    head_state="%s",
    parent_id="%s",
    checkpoint=CHECKPOINT,
    run=RUN,
)
_SQLITE_MOVE = f"""
UPDATE {RUN} SET version = version + 1, checkpoint_sequence = %s, latest_checkpoint_id = %s,
    latest_checkpoint_sha256 = %s, state = %s, step = %s, status = %s, status_reason = %s,
    next_eligible_at = %s, budget_used = %s,
    lease_owner = CASE WHEN %s AND lease_owner = %s THEN '' ELSE lease_owner END,
    lease_expires_at = CASE WHEN %s AND lease_owner = %s THEN NULL
                            WHEN %s IS NOT NULL AND lease_owner = %s THEN {_SQLITE_LATER}
                            ELSE lease_expires_at END,
    updated_at = %s
 WHERE id = %s AND tenant_id = %s AND version = %s AND status = %s
   AND json(budget_used) = json(%s) AND json(budget_limits) = json(%s)
   AND (lease_owner = '' OR lease_expires_at IS NULL OR lease_expires_at <= {_SQLITE_NOW}
        OR lease_owner = %s)
   {_SQLITE_HEAD_INTACT}
"""
_SQLITE_INSERT = f"""
INSERT INTO {CHECKPOINT} (id, tenant_id, run_id, sequence, parent_id, state, step,
    schema_version, envelope_sealed, key_id, sha256, parent_sha256, actor, is_evidence,
    created_at)
VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)
"""
_SQLITE_QUEUE = f"""
INSERT INTO {OUTBOX} (tenant_id, run_id, kind, payload, created_at, available_at,
    claimed_until, sent_at, attempts)
VALUES (%s, %s, %s, %s, %s, %s, CASE WHEN %s IS NULL THEN NULL ELSE {_SQLITE_LATER} END, %s, 0)
"""
_SQLITE_CONSUME = f"UPDATE {OUTBOX} SET sent_at = %s WHERE id = %s AND sent_at IS NULL"


def _hex(value: UUID | None) -> str | None:
    return None if value is None else UUID(str(value)).hex


def _sqlite_time(value: datetime | None) -> str | None:
    return None if value is None else connection.ops.adapt_datetimefield_value(value)


def _sqlite_commit(write: CommitWrite) -> int | None:
    head, t = write.head, _sqlite_time
    run_id, tenant_id = _hex(head.id), _hex(head.tenant_id)
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            _SQLITE_MOVE,
            [
                write.sequence,
                _hex(write.checkpoint_id),
                write.sha256,
                write.state,
                write.step,
                write.status,
                write.status_reason,
                t(write.next_eligible_at),
                _json(write.budget_used),
                write.lease_release,
                write.lease_owner,
                write.lease_release,
                write.lease_owner,
                write.lease_seconds,
                write.lease_owner,
                write.lease_seconds,
                t(write.now),
                run_id,
                tenant_id,
                head.version,
                head.status,
                _json(head.budget_used),
                _json(head.budget_limits),
                write.lease_owner,
                write.parent_sha256,
                write.sequence,
                head.state,
                _hex(write.parent_id),
                _hex(write.parent_id),
                _hex(write.parent_id),
            ],
        )
        if cursor.rowcount != 1:
            return None
        cursor.execute(
            _SQLITE_INSERT,
            [
                _hex(write.checkpoint_id),
                tenant_id,
                run_id,
                write.sequence,
                _hex(write.parent_id),
                write.state,
                write.step,
                write.schema_version,
                write.envelope_sealed,
                write.key_id,
                write.sha256,
                write.parent_sha256,
                write.actor,
                write.is_evidence,
                t(write.now),
            ],
        )
        cursor.execute(
            _SQLITE_QUEUE,
            [
                tenant_id,
                run_id,
                write.outbox_kind,
                _json(write.outbox_payload),
                t(write.now),
                t(write.outbox_available_at),
                write.outbox_claim_seconds,
                write.outbox_claim_seconds,
                t(write.outbox_sent_at),
            ],
        )
        outbox_id = cursor.lastrowid
        if write.consumed_outbox_id is not None:
            cursor.execute(_SQLITE_CONSUME, [t(write.now), write.consumed_outbox_id])
    return outbox_id


def _aware(value: Any) -> datetime | None:
    if value is None or isinstance(value, datetime):
        return value if value is None or value.tzinfo else value.replace(tzinfo=UTC)
    parsed = parse_datetime(value)
    return parsed if parsed is None or parsed.tzinfo else parsed.replace(tzinfo=UTC)


def _uuid(value: Any) -> UUID | None:
    return None if value is None else value if isinstance(value, UUID) else UUID(str(value))


_PG_LEASE_CHECK = (
    f"SELECT version, status, lease_owner, paused FROM {RUN} WHERE id = %(run_id)s::uuid"
)
_SQLITE_LEASE_CHECK = f"SELECT version, status, lease_owner, paused FROM {RUN} WHERE id = %s"


def run_lease_check(*, run_id: UUID) -> tuple[int, str, str, bool] | None:
    """The run's version, status, lease owner and whether an operator paused it (one
    statement): what a worker's lean step checks before it runs, to know the run is still
    its own and may go on."""
    if connection.vendor == "postgresql":
        return _pg_execute(_PG_LEASE_CHECK, {"run_id": _uuid(run_id)})
    with connection.cursor() as cursor:
        cursor.execute(_SQLITE_LEASE_CHECK, [_hex(_uuid(run_id))])
        return cursor.fetchone()


# --- the two operations -----------------------------------------------------------------------
def head_read(*, tenant_id: object, run_id: UUID | str) -> RunHead | None:
    """The run's head, or None when the tenant has no such run. One statement."""
    try:
        run_uuid = _uuid(run_id)
    except ValueError:
        return None
    if connection.vendor == "postgresql":
        row = _pg_execute(_PG_HEAD, {"run_id": run_uuid, "tenant_id": _uuid(tenant_id)})
    else:
        with connection.cursor() as cursor:
            cursor.execute(_SQLITE_HEAD, [_hex(run_uuid), _hex(_uuid(tenant_id))])
            row = cursor.fetchone()
    if row is None:
        return None
    return RunHead(
        id=_uuid(row[0]),
        tenant_id=_uuid(row[1]),
        workflow_id=row[2],
        workflow_type=row[3],
        workflow_version=row[4],
        definition=_loads(row[5]),
        execution=row[6],
        version=row[7],
        status=row[8],
        state=row[9],
        checkpoint_sequence=row[10],
        latest_checkpoint_id=_uuid(row[11]),
        latest_checkpoint_sha256=row[12],
        lease_owner=row[13],
        lease_expires_at=_aware(row[14]),
        budget_used=_loads(row[15]) or {},
        budget_limits=_loads(row[16]) or {},
        integrity_problem=_head_problem(row),
    )


def _head_problem(row: tuple) -> str | None:
    """A sentence when the run's row (``row[:17]``, its step at 17) and its head checkpoint's
    row (18-22) disagree; None when they agree (or the run has no checkpoint yet)."""
    if row[11] is None and not row[10]:
        return None
    if row[18] is None:
        return f"the run's latest checkpoint {row[10]} is missing; no checkpoint can follow it"
    differ = [
        f"{column} '{stored}' where its head checkpoint's row says '{sealed}'"
        for column, stored, sealed in (
            ("state", row[9], row[21]),
            ("step", row[17], row[22]),
            ("sequence", row[10], row[20]),
            ("latest hash", row[12], row[19]),
        )
        if stored != sealed
    ]
    if not differ:
        return None
    return f"the run's row says {' and '.join(differ)}; a row was altered after it was written"


def commit_write(write: CommitWrite) -> int | None:
    """Write the commit: the run's head moves, the checkpoint and the outbox message are
    inserted, the consumed command is marked sent. Returns the outbox message's id, or None
    when the run is no longer at ``write.head`` (then nothing was written).

    One statement on PostgreSQL; one transaction of three or four statements on SQLite.
    Inside a caller's transaction it joins that transaction.
    """
    if connection.vendor != "postgresql":
        return _sqlite_commit(write)
    outbox_id, inserted, _consumed, _notified = _pg_execute(_PG_COMMIT, _pg_params(write))
    return outbox_id if inserted == 1 else None
