"""Shared helpers for the benchmarks: timing, payloads, the scratch database, Django setup.

Benchmarks are not tests: they report numbers and ratios, they assert nothing.
"""

from __future__ import annotations

import json
import os
import statistics
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = Path(__file__).resolve().parent / "results"
PG_SERVER = os.environ.get("BENCH_PG_SERVER", "postgres://postgres@127.0.0.1:5432")
BENCH_DB = os.environ.get("BENCH_DB", "cairn_bench")
REDIS_URL = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/14")
QUICK = os.environ.get("BENCH_QUICK") == "1"  # a smoke run: fewer rounds, shorter histories


def db_url(name: str = BENCH_DB) -> str:
    return f"{PG_SERVER}/{name}"


def recreate_database(name: str) -> None:
    import psycopg

    with psycopg.connect(f"{PG_SERVER}/postgres", autocommit=True) as conn:
        conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s", [name]
        )
        conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
        conn.execute(f'CREATE DATABASE "{name}"')


def vacuum_analyze(name: str) -> None:
    """VACUUM and ANALYZE every table of the database ``name`` that holds rows: what
    autovacuum does on a live system. The CI machine's server runs with it off
    (``autovacuum_setting``), so without this a case would start on the dead row versions
    and the missing statistics the cases before it left (85,000 dead versions of the run
    table after the writers case, and prepared statements planned on tables never
    analyzed).

    An empty table is left as it is, never analyzed, as autovacuum leaves a table nothing
    has written. Analyzed while empty, its statistics say so, and a statement prepared
    while it is still small keeps a plan that scans it whole: the commit's generic plan
    then read every checkpoint and outbox row on every commit, 0.69 ms a commit growing to
    1.25 ms over 3,000 (the first case of a run began that way on 2026-12-07)."""
    import psycopg
    from psycopg import sql

    with psycopg.connect(db_url(name), autocommit=True) as conn:
        tables = conn.execute(
            "SELECT schemaname, relname FROM pg_stat_user_tables ORDER BY 1, 2"
        ).fetchall()
        for schema, table in tables:
            name_sql = sql.Identifier(schema, table)
            if conn.execute(
                sql.SQL("SELECT EXISTS (SELECT 1 FROM {})").format(name_sql)
            ).fetchone()[0]:
                conn.execute(sql.SQL("VACUUM (ANALYZE) {}").format(name_sql))


def autovacuum_setting() -> str:
    """The server's ``autovacuum`` setting (on or off), for the results' header."""
    import psycopg

    with psycopg.connect(f"{PG_SERVER}/postgres", autocommit=True) as conn:
        row = conn.execute("SHOW autovacuum").fetchone()
    return row[0] if row else "unknown"


def payload(size_bytes: int) -> dict:
    """A JSON agent state of about ``size_bytes``: messages with text, like a chat history."""
    messages, total, index = [], 0, 0
    while total < size_bytes:
        text = (
            f"Step {index}: the agent read source {index % 7} and noted claim {index * 31 % 97}. "
        )
        text = text * 3
        messages.append({"role": "assistant" if index % 2 else "user", "content": text, "n": index})
        total += len(text) + 40
        index += 1
    return {"messages": messages, "cursor": index, "done": False}


@dataclass
class Measurement:
    case: str
    system: str
    variant: str
    unit: str = "ms"
    samples: list[float] = field(default_factory=list)
    throughput: float | None = None  # operations per second, where it applies
    note: str = ""
    # Measured on the wire (bench/wire.py), per operation; None where not measured.
    round_trips: float | None = None
    statements: float | None = None
    transactions: float | None = None

    def counted(self, counts) -> Measurement:  # noqa: ANN001
        if counts is not None:
            self.round_trips = round(counts.round_trips, 2)
            self.statements = round(counts.statements, 2)
            self.transactions = round(counts.transactions, 2)
        return self

    @property
    def median(self) -> float:
        return statistics.median(self.samples) if self.samples else float("nan")

    @property
    def p95(self) -> float:
        if not self.samples:
            return float("nan")
        ordered = sorted(self.samples)
        return ordered[min(len(ordered) - 1, int(round(0.95 * (len(ordered) - 1))))]

    @property
    def p99(self) -> float:
        if not self.samples:
            return float("nan")
        ordered = sorted(self.samples)
        return ordered[min(len(ordered) - 1, int(round(0.99 * (len(ordered) - 1))))]

    def summary(self) -> dict:
        data = asdict(self)
        data.pop("samples")
        data.update(
            median=round(self.median, 4),
            p95=round(self.p95, 4),
            p99=round(self.p99, 4),
            n=len(self.samples),
        )
        return data


def time_each(operation: Callable[[int], object], count: int, warmup: int) -> list[float]:
    """Run ``operation(i)`` warmup + count times; return the measured latencies in ms."""
    for i in range(warmup):
        operation(i)
    samples = []
    for i in range(warmup, warmup + count):
        start = time.perf_counter()
        operation(i)
        samples.append((time.perf_counter() - start) * 1000)
    return samples


def timed_threads(threads: Sequence[threading.Thread]) -> float:
    """Start ``threads``, wait for all of them; the seconds from the first start to the last
    join (creating them stays outside the time)."""
    start = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return time.perf_counter() - start


def cpu_seconds(pid: int) -> float:
    """User and system CPU time of a process so far (every thread), from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def write_json(path: Path, data: object) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2, default=str) + "\n")


def setup_django(database: str = BENCH_DB, *, home: Path | None = None, **environ: str) -> None:
    """Configure Cairn against the scratch database (call once, before importing Cairn).

    Without ``home`` each run seals with a fresh key in the environment, which the worker
    and server processes it starts inherit. A fixed ``home`` keeps its key file instead, for
    a benchmark that measures a database seeded by an earlier run. ``environ`` sets further
    variables.
    """
    os.environ["DATABASE_URL"] = db_url(database)
    os.environ.update(environ)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "cairn.settings")
    os.environ.setdefault("CELERY_BROKER_URL", REDIS_URL)
    os.environ["CAIRN_DISPATCH_ON_COMMIT"] = "0"
    os.environ.setdefault("CAIRN_LOG_LEVEL", "WARNING")
    # Production settings (DEBUG off, production storage and cookies), for this process and
    # the workers and server it starts. TLS ends in front of gunicorn, as in production.
    os.environ["CAIRN_ENV"] = "production"
    os.environ["DJANGO_DEBUG"] = "0"
    os.environ.setdefault("DJANGO_SECURE_SSL_REDIRECT", "0")
    os.environ.setdefault("DJANGO_ALLOWED_HOSTS", "127.0.0.1,localhost")
    if not os.environ.get("DJANGO_SECRET_KEY"):
        import secrets

        os.environ["DJANGO_SECRET_KEY"] = secrets.token_urlsafe(50)
    os.environ.setdefault("CAIRN_HOME", str(home or RESULTS / ".home"))
    if home is None and not os.environ.get("CAIRN_ENCRYPTION_KEYS"):
        from checkpoints.crypto import new_key_spec

        # Worker processes and gunicorn inherit the same key.
        os.environ["CAIRN_ENCRYPTION_KEYS"] = new_key_spec("bench")
    import sys

    sys.path.insert(0, str(ROOT))
    import django

    django.setup()
