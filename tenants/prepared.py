"""One statement on a server-side prepared statement of Django's PostgreSQL connection
(psycopg 3), for the statements every request or commit runs: planned once per connection
instead of on every execution. The token's statement (``tenants.token_sql``) cost 0.85 ms a
request planned each time and 0.13 ms prepared; the commit's (``checkpoints.services.
commit_sql``) is prepared for the same reason. Behind PgBouncer use session pooling: the
prepared statements live on the server connection (docs/deployment.md).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import cache
from typing import Any, TypeVar
from uuid import UUID

import psycopg
from django.db import DEFAULT_DB_ALIAS, connections
from django.db.models import Model
from django.utils.dateparse import parse_datetime

M = TypeVar("M", bound=Model)

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


def prepared_fetchall(sql: str, params: Mapping[str, Any] | Sequence[Any]) -> list[tuple]:
    """Run one statement on a prepared-statement cursor of Django's connection (its error
    translation and execute wrappers apply) and return its rows. Logged like Django's
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
    rows = cursor.fetchall()
    if db.queries_logged:
        db.queries_log.append(
            {"sql": " ".join(sql.split()), "time": f"{time.monotonic() - started:.3f}"}
        )
    return rows


def prepared_fetchone(sql: str, params: Mapping[str, Any] | Sequence[Any]) -> tuple | None:
    """``prepared_fetchall``'s first row, or None."""
    rows = prepared_fetchall(sql, params)
    return rows[0] if rows else None


def statement_fetchall(pg_sql: str, sqlite_sql: str, params: Mapping[str, Any]) -> list[tuple]:
    """The rows of one statement on either database: prepared on PostgreSQL
    (``prepared_fetchall``); on SQLite a plain statement (sqlite3 keeps it prepared) with
    UUID parameters as Django stores them there (hex)."""
    db = connections[DEFAULT_DB_ALIAS]
    if db.vendor == "postgresql":
        return prepared_fetchall(pg_sql, params)
    embedded = {k: v.hex if isinstance(v, UUID) else v for k, v in params.items()}
    with db.cursor() as cursor:
        cursor.execute(sqlite_sql, embedded)
        return cursor.fetchall()


def statement_fetchone(pg_sql: str, sqlite_sql: str, params: Mapping[str, Any]) -> tuple | None:
    """``statement_fetchall``'s first row, or None."""
    rows = statement_fetchall(pg_sql, sqlite_sql, params)
    return rows[0] if rows else None


# --- model instances from a statement's row ----------------------------------------------
# For a hot read that must hand on a model instance (a worker's run, its head checkpoint):
# the statement is prepared, and the row becomes the instance the ORM would have built.


def model_columns(model: type[Model], alias: str) -> str:
    """The model's concrete columns in field order, for a SELECT: ``alias."column", …``."""
    return ", ".join(f'{alias}."{field.column}"' for field in model._meta.concrete_fields)


@cache
def _converters(model: type[Model], vendor: str) -> tuple[tuple[tuple[Callable, ...], Any], ...]:
    """Per column: its converters and the column expression they are called with."""
    db = connections[DEFAULT_DB_ALIAS]
    converters = []
    for field in model._meta.concrete_fields:
        column = field.get_col(model._meta.db_table)
        found = db.ops.get_db_converters(column) + column.get_db_converters(db)
        converters.append((tuple(found), column))
    return tuple(converters)


def model_from_row(model: type[M], values: Sequence[Any]) -> M:
    """The instance of ``model`` the ORM builds from these values (its columns as
    ``model_columns`` selects them): each value through the backend's and the field's
    converters, as a queryset converts it; the instance is loaded (not adding) from the
    default database."""
    db = connections[DEFAULT_DB_ALIAS]
    converted = []
    for value, (converters, column) in zip(values, _converters(model, db.vendor), strict=True):
        for convert in converters:
            value = convert(value, column, db)
        converted.append(value)
    names = [field.attname for field in model._meta.concrete_fields]
    return model.from_db(DEFAULT_DB_ALIAS, names, converted)


# --- one statement, each database's spelling ----------------------------------------------
@dataclass(frozen=True)
class Dialect:
    """How one database spells a statement's named parameters and its clock. PostgreSQL
    casts each parameter (the statement is prepared once, server-side, so its types are
    fixed); SQLite's ``'now'`` is this machine's clock, which is its database's: it is
    embedded."""

    casts: bool
    now: str

    def p(self, name: str, kind: str) -> str:
        return f"%({name})s::{kind}" if self.casts else f"%({name})s"

    def later(self, seconds: str) -> str:
        """``seconds`` (a parameter's name) after the statement's time, on its clock."""
        if self.casts:
            return f"{self.now} + %({seconds})s::integer * interval '1 second'"
        return f"strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now', '+' || %({seconds})s || ' seconds')"

    def json_equal(self, column: str, name: str) -> str:
        if self.casts:
            return f"{column} = %({name})s::jsonb"
        return f"json({column}) = json(%({name})s)"


POSTGRES = Dialect(casts=True, now="statement_timestamp()")
SQLITE = Dialect(casts=False, now="strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now')")


def aware_datetime(value: Any) -> datetime | None:
    """A time a statement returned, aware (SQLite returns its text, in UTC)."""
    if value is None or isinstance(value, datetime):
        return value if value is None or value.tzinfo else value.replace(tzinfo=UTC)
    parsed = parse_datetime(value)
    return parsed if parsed is None or parsed.tzinfo else parsed.replace(tzinfo=UTC)
