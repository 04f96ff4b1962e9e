"""Commit latency, recorded across processes.

Every process that commits (web, each worker) buffers its commit durations in memory and
writes them as ``CommitLatencySample`` rows in one INSERT at most every
``CAIRN_METRICS_FLUSH_SECONDS`` (the next commit after that flushes), so measuring adds no
write, and no fsync, to a commit. ``latency_rollup`` (run by the metrics beat task) folds
samples older than a minute into cumulative bucket totals and deletes them, so the
histogram served at ``/metrics`` is monotonic, covers every process, and the sample table
stays small. A process that dies loses at most its unflushed samples.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from datetime import timedelta

from django.conf import settings
from django.db import DatabaseError, connection, transaction
from django.db.models import Count, F, Q, Sum
from django.utils import timezone

from telemetry import tracing
from telemetry.models import CommitLatencySample, MetricTotal

log = logging.getLogger("cairn.metrics")

COMMIT_LATENCY = "cairn_checkpoint_commit_seconds"
BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
ROLLUP_AGE = timedelta(seconds=60)
MAX_PENDING = 1000

_lock = threading.Lock()
_pending: list[float] = []
_flushed_at = time.monotonic()


def commit_latency_record(*, seconds: float) -> None:
    """Buffer one sample; flush the buffer when it is due. Never raises: a metrics failure
    never fails the commit that was just made."""
    with _lock:
        _pending.append(max(0.0, seconds))
        due = (
            len(_pending) >= MAX_PENDING
            or time.monotonic() - _flushed_at >= settings.CAIRN_METRICS_FLUSH_SECONDS
        )
    if due:
        latency_flush()


def latency_flush() -> int:
    """Write this process's buffered samples (one INSERT). Returns how many."""
    global _flushed_at
    with _lock:
        samples = list(_pending)
        _pending.clear()
        _flushed_at = time.monotonic()
    if not samples:
        return 0
    try:
        # Metrics bookkeeping, whichever commit happens to flush it: not a span of that
        # commit's step (tracing.protocol_statements).
        with tracing.protocol_statements(), connection.cursor() as cursor:
            cursor.execute(*_insert(samples))
    except DatabaseError:
        log.warning("commit latency samples not recorded", exc_info=True)
        return 0
    return len(samples)


_TABLE = CommitLatencySample._meta.db_table


def _insert(samples: list[float]) -> tuple[str, list]:
    """One INSERT of every sample with two parameters, however many samples: the samples
    as one array (PostgreSQL) or one JSON list (SQLite). Not the ORM: the commit that fills
    the buffer pays for the write, and a thousand model instances and their compiled INSERT
    (three on SQLite, past its 999 parameters) cost it about 20 ms."""
    now = timezone.now()
    if connection.vendor == "postgresql":
        sql = f"INSERT INTO {_TABLE} (seconds, created_at) SELECT s, %s FROM unnest(%s::float8[]) s"
        return sql, [now, samples]
    sql = f"INSERT INTO {_TABLE} (seconds, created_at) SELECT value, %s FROM json_each(%s)"
    return sql, [connection.ops.adapt_datetimefield_value(now), json.dumps(samples)]


def _le(bound: float) -> str:
    return f'le="{bound:g}"'


def _fold(samples: Q | None = None) -> dict[str, float]:
    """Cumulative bucket counts, count and sum of the samples matching ``samples``."""
    rows = CommitLatencySample.objects.filter(samples or Q())
    aggregates = {f"b{i}": Count("id", filter=Q(seconds__lte=b)) for i, b in enumerate(BUCKETS)}
    values = rows.aggregate(total=Count("id"), total_seconds=Sum("seconds"), **aggregates)
    folded = {_le(b): float(values[f"b{i}"]) for i, b in enumerate(BUCKETS)}
    folded['le="+Inf"'] = float(values["total"])
    folded["count"] = float(values["total"])
    folded["sum"] = float(values["total_seconds"] or 0.0)
    return folded


def latency_histogram() -> dict[str, float]:
    """The whole histogram: rolled-up totals plus the samples not rolled up yet."""
    totals = dict(MetricTotal.objects.filter(name=COMMIT_LATENCY).values_list("labels", "value"))
    live = _fold()
    return {key: totals.get(key, 0.0) + value for key, value in live.items()}


def latency_rollup(*, limit: int = 10_000) -> int:
    """Fold up to ``limit`` samples older than a minute into the totals and delete them.

    Atomic: the totals and the deletion commit together, over one explicit list of ids, so
    a sample is counted exactly once. Concurrent rollups serialize on the count row.
    """
    cutoff = timezone.now() - ROLLUP_AGE
    with transaction.atomic():
        count_row, _ = MetricTotal.objects.get_or_create(name=COMMIT_LATENCY, labels="count")
        MetricTotal.objects.select_for_update().filter(pk=count_row.pk).get()
        ids = list(
            CommitLatencySample.objects.filter(created_at__lt=cutoff)
            .order_by("id")
            .values_list("id", flat=True)[:limit]
        )
        if not ids:
            return 0
        for labels, value in _fold(Q(id__in=ids)).items():
            MetricTotal.objects.get_or_create(name=COMMIT_LATENCY, labels=labels)
            MetricTotal.objects.filter(name=COMMIT_LATENCY, labels=labels).update(
                value=F("value") + value
            )
        CommitLatencySample.objects.filter(id__in=ids).delete()
    return len(ids)
