"""The SQL of the checkpoint commit: the one module that writes a checkpoint.

``checkpoint_commit`` (``checkpoints.services.checkpoints``) decides and seals; this module
reads the run's head and writes the commit. It is SQL on purpose: the commit is the hot
path of every run, and Django building and compiling four ORM statements cost more than
the database did (docs/performance.md). So are the few statements every worker task makes
before its first step (``reads``, ``runtime.services.leases``, ``runtime.lease``) and every
run's start (``workflows``, ``outbox``), on ``tenants.prepared``; everything else uses the
ORM.

PostgreSQL: the commit is **one statement**, data-modifying CTEs that make the optimistic
``UPDATE run … WHERE id AND version … RETURNING``, insert the checkpoint and the outbox
message from what the update returned, and mark the caller's previous in-loop command as
consumed. When the run is not at the head the caller built the envelope from, the update
matches no row, the inserts select from nothing, and nothing is written. Outside a
transaction it is one round trip (an implicit transaction); it runs on a server-side
prepared statement (psycopg 3), parsed once per connection.

SQLite (in process, no round trips): the same protocol as plain statements in one
transaction (the settings open transactions ``IMMEDIATE``); sqlite3 keeps them prepared.
Both databases' statements come from one template (``_move`` and its siblings, spelled by a
``Dialect`` of ``tenants.prepared``) and take one set of named parameters (``_commit_params``).

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
from dataclasses import dataclass, replace
from datetime import datetime
from functools import cache
from typing import Any
from uuid import UUID

from django.db import connection, transaction

from checkpoints.models import Checkpoint, OutboxMessage, Run, WorkflowDefinition
from checkpoints.services.changes import CHANNEL
from tenants.models import ApiToken
from tenants.prepared import (
    POSTGRES,
    SQLITE,
    Dialect,
    aware_datetime,
    prepared_fetchone,
    statement_fetchone,
)
from tenants.token_sql import token_columns, token_from_row, token_live, token_tables, token_width

RUN = Run._meta.db_table
CHECKPOINT = Checkpoint._meta.db_table
OUTBOX = OutboxMessage._meta.db_table
WORKFLOW = WorkflowDefinition._meta.db_table


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

    def after(self, write: CommitWrite, committed: Committed) -> RunHead:
        """The run as ``write`` left it: its new position and usage, and its lease as the
        statement returned it (renewed, released or untouched, on the database's clock)."""
        return replace(
            self,
            version=self.version + 1,
            status=write.status,
            state=write.state,
            checkpoint_sequence=write.sequence,
            latest_checkpoint_id=write.checkpoint_id,
            latest_checkpoint_sha256=write.sha256,
            lease_owner=committed.lease_owner,
            lease_expires_at=committed.lease_expires_at,
            budget_used=write.budget_used,
        )


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
    attempt: dict[str, Any] | None  # the step attempt this checkpoint ends (step history)
    now: datetime


@dataclass(frozen=True)
class Committed:
    """What the commit's statement returns: its outbox message and the run's lease as the
    statement left it (renewed or released on the database's clock, or untouched)."""

    outbox_id: int
    lease_owner: str
    lease_expires_at: datetime | None


def _json(value: Any) -> str:
    # The standard encoder's spacing, as the ORM writes a JSONField: on SQLite another
    # writer's conditional UPDATE (a charge) compares the stored text as written.
    return json.dumps(value)


def _loads(value: Any) -> Any:
    return json.loads(value) if isinstance(value, str | bytes) else value


# What a commit reads of its run (RunHead's fields, in order), then the run's step and its
# head checkpoint's row (id, sha256, sequence, state, step) for the integrity check; each
# database names its own placeholders for the run and the tenant.
_HEAD_COLUMNS = """
       r.id, r.tenant_id, r.workflow_id, r.workflow_type, r.workflow_version, w.definition,
       r.execution, r.version, r.status, r.state, r.checkpoint_sequence,
       r.latest_checkpoint_id, r.latest_checkpoint_sha256, r.lease_owner, r.lease_expires_at,
       r.budget_used, r.budget_limits,
       r.step, c.id, c.sha256, c.sequence, c.state, c.step"""
# The run's workflow and its head checkpoint, joined to the run ``r`` for ``_HEAD_COLUMNS``
# (which run is the caller's WHERE, or the token's LEFT JOIN in ``_token_head``).
_HEAD_JOINS = f"""
  JOIN {WORKFLOW} w ON w.id = r.workflow_id
  LEFT JOIN {CHECKPOINT} c ON c.id = r.latest_checkpoint_id AND c.run_id = r.id"""
_HEAD_SELECT = f"""
SELECT {_HEAD_COLUMNS}
  FROM {RUN} r {_HEAD_JOINS}
 WHERE r.id = {{run_id}} AND r.tenant_id = {{tenant_id}}
"""


@cache
def _token_head(d: Dialect) -> str:
    """The token's statement (``tenants.token_sql``) with, in the same row, the head of the
    run ``run_id`` when the token's own tenant has it (NULLs when not): the tenant is the
    token's, by the join, never a parameter."""
    return f"""
SELECT {token_columns()}, {_HEAD_COLUMNS}
  FROM {token_tables()}
  LEFT JOIN ({RUN} r {_HEAD_JOINS})
    ON r.id = {d.p("run_id", "uuid")} AND r.tenant_id = t.tenant_id
 WHERE {token_live("%(key_sha256)s")}
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


# --- the commit's SQL: one template, each database's dialect -----------------------------


def _move(d: Dialect) -> str:
    """The optimistic move of the run's head: writes only on the head the commit was decided
    on, intact (``_HEAD_INTACT``), and returns the lease as the statement left it."""
    owner = d.p("lease_owner", "text")
    releases = f"{d.p('lease_release', 'boolean')} AND lease_owner = {owner}"
    intact = _HEAD_INTACT.format(
        parent_sha256=d.p("parent_sha256", "text"),
        sequence=d.p("sequence", "bigint"),
        head_state=d.p("head_state", "text"),
        parent_id=d.p("parent_id", "uuid"),
        checkpoint=CHECKPOINT,
        run=RUN,
    )
    return f"""
    UPDATE {RUN} SET
        version = version + 1,
        checkpoint_sequence = {d.p("sequence", "bigint")},
        latest_checkpoint_id = {d.p("checkpoint_id", "uuid")},
        latest_checkpoint_sha256 = {d.p("sha256", "text")},
        latest_checkpoint_at = {d.p("now", "timestamptz")},
        state = {d.p("state", "text")},
        step = {d.p("step", "text")},
        status = {d.p("status", "text")},
        status_reason = {d.p("status_reason", "text")},
        next_eligible_at = {d.p("next_eligible_at", "timestamptz")},
        budget_used = {d.p("budget_used", "jsonb")},
        lease_owner = CASE WHEN {releases} THEN '' ELSE lease_owner END,
        lease_expires_at = CASE
            WHEN {releases} THEN NULL
            WHEN {d.p("lease_seconds", "integer")} IS NOT NULL AND lease_owner = {owner}
            THEN {d.later("lease_seconds")}
            ELSE lease_expires_at END,
        updated_at = {d.p("now", "timestamptz")}
     WHERE id = {d.p("run_id", "uuid")}
       AND tenant_id = {d.p("tenant_id", "uuid")}
       AND version = {d.p("expected_version", "bigint")}
       AND status = {d.p("head_status", "text")}
       AND {d.json_equal("budget_used", "head_used")}
       AND {d.json_equal("budget_limits", "head_limits")}
       AND (lease_owner = '' OR lease_expires_at IS NULL
            OR lease_expires_at <= {d.now} OR lease_owner = {owner})
       {intact}
    RETURNING id, execution, lease_owner, lease_expires_at"""


_CHECKPOINT_COLUMNS = (
    "id, tenant_id, run_id, sequence, parent_id, state, step, schema_version, "
    "envelope_sealed, key_id, sha256, parent_sha256, actor, is_evidence, attempt, created_at"
)
_OUTBOX_COLUMNS = (
    "tenant_id, run_id, kind, payload, created_at, available_at, claimed_until, sent_at, attempts"
)


def _checkpoint_values(d: Dialect) -> str:
    kinds = (
        ("checkpoint_id", "uuid"), ("tenant_id", "uuid"), ("run_id", "uuid"),
        ("sequence", "bigint"), ("parent_id", "uuid"), ("state", "text"), ("step", "text"),
        ("schema_version", "integer"), ("envelope_sealed", "text"), ("key_id", "text"),
        ("sha256", "text"), ("parent_sha256", "text"), ("actor", "text"),
        ("is_evidence", "boolean"), ("attempt", "jsonb"), ("now", "timestamptz"),
    )  # fmt: skip
    return ", ".join(d.p(name, kind) for name, kind in kinds)


def _outbox_values(d: Dialect) -> str:
    claim = d.p("outbox_claim_seconds", "integer")
    return ", ".join(
        (
            d.p("tenant_id", "uuid"),
            d.p("run_id", "uuid"),
            d.p("outbox_kind", "text"),
            d.p("outbox_payload", "jsonb"),
            d.p("now", "timestamptz"),
            d.p("outbox_available_at", "timestamptz"),
            f"CASE WHEN {claim} IS NULL THEN NULL ELSE {d.later('outbox_claim_seconds')} END",
            d.p("outbox_sent_at", "timestamptz"),
            "0",
        )
    )


def _consume(d: Dialect) -> str:
    return (
        f"UPDATE {OUTBOX} SET sent_at = {d.p('now', 'timestamptz')}"
        f" WHERE id = {d.p('consumed_outbox_id', 'bigint')} AND sent_at IS NULL"
    )


# PostgreSQL: one statement. ``notified``: runners long-poll externally driven runs (GET
# /runs/{id}/next); NOTIFY wakes them when this transaction commits (``changes``).
_PG_COMMIT = f"""
WITH moved AS ({_move(POSTGRES)}
), notified AS (
    SELECT pg_notify('{CHANNEL}', id::text) FROM moved WHERE execution = 'external'
), inserted AS (
    INSERT INTO {CHECKPOINT} ({_CHECKPOINT_COLUMNS})
    SELECT {_checkpoint_values(POSTGRES)} FROM moved
    RETURNING id
), queued AS (
    INSERT INTO {OUTBOX} ({_OUTBOX_COLUMNS})
    SELECT {_outbox_values(POSTGRES)} FROM moved
    RETURNING id
), consumed AS (
    {_consume(POSTGRES)} AND EXISTS (SELECT 1 FROM moved)
    RETURNING id
)
SELECT (SELECT id FROM queued), (SELECT count(*) FROM inserted),
       (SELECT lease_owner FROM moved), (SELECT lease_expires_at FROM moved),
       (SELECT count(*) FROM consumed), (SELECT count(*) FROM notified)
"""
# SQLite: the same statements, one after the other in one transaction.
_SQLITE_MOVE = _move(SQLITE)
_SQLITE_INSERT = (
    f"INSERT INTO {CHECKPOINT} ({_CHECKPOINT_COLUMNS}) VALUES ({_checkpoint_values(SQLITE)})"
)
_SQLITE_QUEUE = f"INSERT INTO {OUTBOX} ({_OUTBOX_COLUMNS}) VALUES ({_outbox_values(SQLITE)})"
_SQLITE_CONSUME = _consume(SQLITE)


def _commit_params(write: CommitWrite, *, embedded: bool) -> dict[str, Any]:
    """The commit's named parameters, for either database (SQLite stores UUIDs as hex and
    times as Django writes them)."""
    head = write.head
    uuid_ = _hex if embedded else _same
    time_ = _sqlite_time if embedded else _same
    return {
        "run_id": uuid_(head.id),
        "tenant_id": uuid_(head.tenant_id),
        "expected_version": head.version,
        "head_status": head.status,
        "head_used": _json(head.budget_used),
        "head_limits": _json(head.budget_limits),
        "head_state": head.state,
        "sequence": write.sequence,
        "checkpoint_id": uuid_(write.checkpoint_id),
        "parent_id": uuid_(write.parent_id),
        "sha256": write.sha256,
        "parent_sha256": write.parent_sha256,
        "state": write.state,
        "step": write.step,
        "status": write.status,
        "status_reason": write.status_reason,
        "next_eligible_at": time_(write.next_eligible_at),
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
        "outbox_available_at": time_(write.outbox_available_at),
        "outbox_claim_seconds": write.outbox_claim_seconds,
        "outbox_sent_at": time_(write.outbox_sent_at),
        "consumed_outbox_id": write.consumed_outbox_id,
        "attempt": None if write.attempt is None else _json(write.attempt),
        "now": time_(write.now),
    }


def _same(value: Any) -> Any:
    return value


_PG_HEAD = _HEAD_SELECT.format(
    run_id=POSTGRES.p("run_id", "uuid"), tenant_id=POSTGRES.p("tenant_id", "uuid")
)
_SQLITE_HEAD = _HEAD_SELECT.format(
    run_id=SQLITE.p("run_id", "uuid"), tenant_id=SQLITE.p("tenant_id", "uuid")
)
_LEASE_CHECK = f"SELECT version, status, lease_owner, paused FROM {RUN} WHERE id = {{run_id}}"
_PG_LEASE_CHECK = _LEASE_CHECK.format(run_id=POSTGRES.p("run_id", "uuid"))
_SQLITE_LEASE_CHECK = _LEASE_CHECK.format(run_id=SQLITE.p("run_id", "uuid"))


# --- SQLite -----------------------------------------------------------------------------------


def _hex(value: UUID | None) -> str | None:
    return None if value is None else UUID(str(value)).hex


def _sqlite_time(value: datetime | None) -> str | None:
    return None if value is None else connection.ops.adapt_datetimefield_value(value)


def _sqlite_commit(write: CommitWrite) -> Committed | None:
    params = _commit_params(write, embedded=True)
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(_SQLITE_MOVE, params)
        moved = cursor.fetchone()
        if moved is None:
            return None
        cursor.execute(_SQLITE_INSERT, params)
        cursor.execute(_SQLITE_QUEUE, params)
        outbox_id = cursor.lastrowid
        if write.consumed_outbox_id is not None:
            cursor.execute(_SQLITE_CONSUME, params)
    return Committed(
        outbox_id=outbox_id, lease_owner=moved[2], lease_expires_at=aware_datetime(moved[3])
    )


def _uuid(value: Any) -> UUID | None:
    return None if value is None else value if isinstance(value, UUID) else UUID(str(value))


def run_lease_check(*, run_id: UUID) -> tuple[int, str, str, bool] | None:
    """The run's version, status, lease owner and whether an operator paused it (one
    statement): what a worker's lean step checks before it runs, to know the run is still
    its own and may go on."""
    return statement_fetchone(_PG_LEASE_CHECK, _SQLITE_LEASE_CHECK, {"run_id": _uuid(run_id)})


# --- the two operations -----------------------------------------------------------------------
def head_read(*, tenant_id: object, run_id: UUID | str) -> RunHead | None:
    """The run's head, or None when the tenant has no such run. One statement."""
    try:
        run_uuid = _uuid(run_id)
    except ValueError:
        return None
    row = statement_fetchone(
        _PG_HEAD, _SQLITE_HEAD, {"run_id": run_uuid, "tenant_id": _uuid(tenant_id)}
    )
    return None if row is None else _head_from_row(row)


def token_head_read(
    *, key_sha256: str, run_id: UUID
) -> tuple[tuple[ApiToken, frozenset[str]], RunHead | None] | None:
    """The live token with this digest, as ``tenants.token_sql.token_row`` finds it, and in
    the same statement the head of ``run_id`` as ``head_read`` reads it for the token's own
    tenant (None when that tenant has no such run). None when there is no such token.
    One statement: a runner's commit reads its token and its head in one round trip."""
    row = statement_fetchone(
        _token_head(POSTGRES),
        _token_head(SQLITE),
        {"key_sha256": key_sha256, "run_id": run_id},
    )
    if row is None:
        return None
    head = row[token_width() :]
    return token_from_row(row), None if head[0] is None else _head_from_row(head)


def _head_from_row(row: tuple) -> RunHead:
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
        lease_expires_at=aware_datetime(row[14]),
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


def commit_write(write: CommitWrite) -> Committed | None:
    """Write the commit: the run's head moves, the checkpoint and the outbox message are
    inserted, the consumed command is marked sent. Returns what the statement wrote that
    the writer cannot know beforehand (the outbox id, the lease as left on the database's
    clock), or None when the run is no longer at ``write.head`` (then nothing was written).

    One statement on PostgreSQL; one transaction of three or four statements on SQLite,
    both from one template (``_move`` and its siblings) and one parameter builder.
    Inside a caller's transaction it joins that transaction.
    """
    if connection.vendor != "postgresql":
        return _sqlite_commit(write)
    row = prepared_fetchone(_PG_COMMIT, _commit_params(write, embedded=False))
    outbox_id, inserted, lease_owner, lease_expires_at = row[:4]
    if inserted != 1:
        return None
    return Committed(
        outbox_id=outbox_id, lease_owner=lease_owner, lease_expires_at=lease_expires_at
    )
