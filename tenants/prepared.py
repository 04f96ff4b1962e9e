"""One statement on a server-side prepared statement of Django's PostgreSQL connection
(psycopg 3), for the statements every request or commit runs: planned once per connection
instead of on every execution. The token's statement (``tenants.token_sql``) cost 0.85 ms a
request planned each time and 0.13 ms prepared; the commit's (``checkpoints.services.
commit_sql``) is prepared for the same reason. Behind PgBouncer use session pooling: the
prepared statements live on the server connection (docs/deployment.md).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

import psycopg
from django.db import DEFAULT_DB_ALIAS, connections

# psycopg prepares a statement after this many executions; Django leaves it off (None) for
# connection poolers, so these statements ask for preparation themselves (``prepare=True``),
# and the threshold only has to be set for psycopg to honour that.
_NEVER_AUTO_PREPARE = 2**31 - 1


class _PreparedCursor(psycopg.Cursor):
    """Server-side binding, and every statement prepared on first use (then reused)."""

    def execute(self, query, params=None, *, prepare=None, binary=None):  # noqa: ANN001, ANN201
        return super().execute(query, params, prepare=True, binary=binary)


def _cursor_of(raw: psycopg.Connection) -> _PreparedCursor:
    """The connection's one prepared-statement cursor, kept with it: a cursor keeps the
    adapters of the parameter and column types it has met, which a new cursor looks up
    again on every statement (about a tenth of the commit's client time). A connection
    serves one thread at a time, and so does its cursor."""
    cursor = getattr(raw, "_cairn_prepared_cursor", None)
    if cursor is None or cursor.closed:
        cursor = raw._cairn_prepared_cursor = _PreparedCursor(raw)  # type: ignore[attr-defined]
    return cursor


def prepared_fetchone(sql: str, params: Mapping[str, Any] | Sequence[Any]) -> tuple | None:
    """Run one statement on a prepared-statement cursor of Django's connection (its error
    translation and execute wrappers apply) and return its one row. Logged like Django's
    own queries when queries are logged (debug, CaptureQueriesContext): psycopg keeps no
    query text for a prepared execution, so Django's debug cursor would log None.
    PostgreSQL only."""
    db = connections[DEFAULT_DB_ALIAS]  # once: each look through the proxy costs a lookup
    db.close_if_health_check_failed()
    db.ensure_connection()
    raw = db.connection
    if raw.prepare_threshold is None:
        raw.prepare_threshold = _NEVER_AUTO_PREPARE
    started = time.monotonic()
    with db.wrap_database_errors:
        cursor = db.make_cursor(_cursor_of(raw))
    cursor.execute(sql, params)
    row = cursor.fetchone()
    if db.queries_logged:
        db.queries_log.append(
            {"sql": " ".join(sql.split()), "time": f"{time.monotonic() - started:.3f}"}
        )
    return row
