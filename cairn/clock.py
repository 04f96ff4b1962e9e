"""The database's clock: the one clock that leases, command claims and worker heartbeats are
set and compared on.

Every process of a deployment shares the database, and no two machines' clocks agree
exactly: a worker whose clock ran 120 s fast took over a healthy worker's lease 3 s into a
45 s step, and one 120 s slow set leases that had already expired, so another worker took
over while it was inside a publish call (docs/deployment.md, "Clocks"). So a lease's expiry
is never computed from a worker's clock:

- **In SQL** the expiry is set and compared with the database's own time: ``Now()``
  (``django.db.models.functions``), which is ``statement_timestamp()`` on PostgreSQL and the
  embedded SQLite's clock (one machine, so the same rule), and ``Now() + ttl`` for an expiry;
  the one-statement commit writes the same expressions (``commit_sql``).
- **In Python**, where a decision must be made before a statement, ``db_now()`` reads the
  database's time (one statement) for decisions nothing re-checks (an operator's grant, a
  cancel deciding an operation never happened), and ``now()`` estimates it without a
  statement for decisions the statement re-checks anyway (the commit's early ``lease_held``
  refusal): this process's clock corrected by the offset its heartbeat last measured
  (``runtime.heartbeats``), or uncorrected before it has measured one.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from django.db import connection
from django.utils import timezone
from django.utils.dateparse import parse_datetime

# This process's clock minus the database's, in seconds, as last measured (0 until then).
_offset_seconds = 0.0

_PG_NOW = "SELECT statement_timestamp()"
_SQLITE_NOW = "SELECT strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now')"


def db_now() -> datetime:
    """The database's current time (one statement), timezone-aware (UTC)."""
    with connection.cursor() as cursor:
        cursor.execute(_PG_NOW if connection.vendor == "postgresql" else _SQLITE_NOW, [])
        (value,) = cursor.fetchone()
    if isinstance(value, str):
        value = parse_datetime(value)
    return value if value.tzinfo else value.replace(tzinfo=UTC)


def offset_record(seconds: float) -> None:
    """Record how far this process's clock is ahead of the database's (negative: behind)."""
    global _offset_seconds
    _offset_seconds = float(seconds)


def offset_seconds() -> float:
    """This process's clock minus the database's, as last measured (0 before)."""
    return _offset_seconds


def now() -> datetime:
    """The database's time as this process estimates it without asking (see module doc):
    only for decisions a statement checks again on the database's own clock."""
    return timezone.now() - timedelta(seconds=_offset_seconds)
