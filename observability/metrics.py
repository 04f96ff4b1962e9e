"""The figures served at ``/metrics``: a prometheus-client collector that reads them from
the database on each scrape, so every web process serves the same numbers whichever process
did the work.

The collector is registered on a registry of its own per scrape, not on prometheus-client's
global one: that one also serves the process and platform collectors, which /metrics never
served, and a fresh registry carries no state from one scrape (or test) to the next.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from datetime import datetime

from django.apps import apps
from django.conf import settings
from django.db import DatabaseError
from django.db.models import Count, Max, Q, Sum
from django.utils import timezone
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4
from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from checkpoints.models import (
    ACTIVE_STATUSES,
    ExternalOperation,
    OperationStatus,
    OutboxMessage,
    Run,
    RunStatus,
)
from checkpoints.services.outbox import outbox_lag_seconds
from observability.selectors import stalled_before
from runtime.heartbeats import workers_tally
from telemetry.counters import counter_values
from telemetry.latency import BUCKETS as LATENCY_BUCKETS
from telemetry.latency import COMMIT_LATENCY, latency_histogram

# generate_latest writes the classic text format; prometheus-client's CONTENT_TYPE_LATEST
# names version 1.0.0 (UTF-8 names) since 0.23, which is not what this document is.
CONTENT_TYPE = CONTENT_TYPE_PLAIN_0_0_4
AGE_BUCKETS = (60, 300, 900, 3600, 6 * 3600, 86400, 7 * 86400)
# Time left before a waiting approval expires: the alert rules ask for "within 15 minutes".
APPROVAL_BUCKETS = (300, 900, 3600, 4 * 3600, 86400)
RETENTION_KINDS = ("checkpoint", "artifact", "run")


def _le(bound: float) -> str:
    """A bucket bound as its ``le`` label: ``60``, ``0.005`` (never ``60.0``), as /metrics
    has always labelled them."""
    return str(int(bound)) if float(bound).is_integer() else repr(float(bound))


def _runs() -> GaugeMetricFamily:
    family = GaugeMetricFamily(
        "cairn_runs", "Runs by tenant and status.", labels=["tenant", "status"]
    )
    counts: dict[str, dict[str, int]] = defaultdict(dict)
    for slug, status, n in (
        Run.objects.values_list("tenant__slug", "status").annotate(n=Count("id")).order_by()
    ):
        counts[slug][status] = n
    for slug, by_status in sorted(counts.items()):
        for status in RunStatus.values:
            family.add_metric([slug, status], by_status.get(status, 0))
    return family


def _checkpoint_ages(now: datetime) -> Iterator[Metric]:
    # Each active run's row says when its head checkpoint was written: no checkpoint read.
    heads = [
        (status, max(0.0, (now - written).total_seconds()))
        for status, written in Run.objects.filter(
            status__in=ACTIVE_STATUSES, latest_checkpoint_at__isnull=False
        ).values_list("status", "latest_checkpoint_at")
    ]
    ages = [age for _, age in heads]
    buckets = [(_le(bound), sum(1 for age in ages if age <= bound)) for bound in AGE_BUCKETS]
    yield HistogramMetricFamily(
        "cairn_active_checkpoint_age_seconds",
        "Age of the latest checkpoint of each active run.",
        buckets=[*buckets, ("+Inf", len(ages))],
        sum_value=sum(ages),
    )
    # By status: a run that waits for a person does not checkpoint, one that runs should.
    oldest = GaugeMetricFamily(
        "cairn_oldest_checkpoint_age_seconds",
        "Age of the oldest latest checkpoint among the active runs in each status (0: none).",
        labels=["status"],
    )
    for status in sorted(ACTIVE_STATUSES):
        oldest.add_metric([status], max((age for s, age in heads if s == status), default=0.0))
    yield oldest


def _restores() -> Iterator[Metric]:
    restores = Run.objects.aggregate(total=Sum("restore_count"), most=Max("restore_count"))
    yield CounterMetricFamily(
        "cairn_restores_total",
        "Restores of all runs (a worker took over a run whose lease expired).",
        value=restores["total"] or 0,
    )
    yield GaugeMetricFamily(
        "cairn_run_restores_max",
        "The most restores of any one run.",
        value=restores["most"] or 0,
    )
    # Active runs only: a crash loop going on now, not a finished run's history.
    active = GaugeMetricFamily(
        "cairn_active_run_restores_max",
        "The most restores of any one active run, per tenant.",
        labels=["tenant"],
    )
    rows = (
        Run.objects.filter(status__in=ACTIVE_STATUSES)
        .values_list("tenant__slug")
        .annotate(most=Max("restore_count"))
        .order_by("tenant__slug")
    )
    for slug, most in rows:
        active.add_metric([slug], most)
    yield active


def _dead_leases(now: datetime) -> GaugeMetricFamily:
    """Active runs whose lease expired without being released: the worker that held it
    died (or hangs), and no worker has taken the run over yet (the rescue would within a
    sweep and a lease, if a worker were there to take it)."""
    count = (
        Run.objects.filter(status__in=ACTIVE_STATUSES, lease_expires_at__lt=now)
        .exclude(lease_owner="")
        .count()
    )
    return GaugeMetricFamily(
        "cairn_runs_lease_expired",
        "Active runs holding a lease that expired unreleased: their worker died or hangs.",
        value=count,
    )


def _workers(now: datetime) -> GaugeMetricFamily:
    live, dead = workers_tally(now=now)
    family = GaugeMetricFamily(
        "cairn_workers",
        "Workers whose heartbeat is live (alive: within CAIRN_WORKER_DEAD_SECONDS), or "
        "older, seen within a day (silent: stopped or dead).",
        labels=["state"],
    )
    family.add_metric(["alive"], live)
    family.add_metric(["silent"], dead)
    return family


def _stalled_operations(now: datetime) -> GaugeMetricFamily:
    family = GaugeMetricFamily(
        "cairn_stalled_operations",
        f"Operations pending for more than {settings.CAIRN_STALLED_OPERATION_SECONDS} seconds.",
        labels=["tenant"],
    )
    rows = (
        ExternalOperation.objects.filter(
            status=OperationStatus.PENDING, created_at__lt=stalled_before(now)
        )
        .values_list("tenant__slug")
        .annotate(n=Count("id"))
        .order_by()
    )
    for slug, n in rows:
        family.add_metric([slug], n)
    return family


def _approvals(now: datetime) -> GaugeMetricFamily | None:
    """Waiting (pending, not yet expired) and expired requests per tenant; None when the
    approvals app has no ApprovalRequest model or table."""
    try:
        model = apps.get_model("approvals", "ApprovalRequest")
    except LookupError:
        return None
    # Only requests a waiting run can still use: one left live on a run that was cancelled
    # or finished is not waiting for anybody.
    waiting = Q(status="pending", expires_at__gt=now, run__status="waiting_approval")
    expired = Q(status="expired") | Q(status="pending", expires_at__lte=now)
    try:
        rows = list(
            model.objects.values_list("tenant__slug")
            .annotate(
                waiting=Count("id", filter=waiting),
                expired=Count("id", filter=expired),
            )
            .order_by()
        )
    except DatabaseError:
        return None
    family = GaugeMetricFamily(
        "cairn_approvals", "Approval requests waiting and expired.", labels=["tenant", "state"]
    )
    for slug, waiting_n, expired_n in sorted(rows):
        family.add_metric([slug, "waiting"], waiting_n)
        family.add_metric([slug, "expired"], expired_n)
    return family


def _approval_time_left(now: datetime) -> HistogramMetricFamily | None:
    """Seconds until each waiting request expires, per tenant: the approvals about to
    expire with nobody having decided. None without the approvals app's table."""
    try:
        model = apps.get_model("approvals", "ApprovalRequest")
    except LookupError:
        return None
    waiting = model.objects.filter(
        status="pending", expires_at__gt=now, run__status="waiting_approval"
    )
    left: dict[str, list[float]] = defaultdict(list)
    try:
        for slug, expires in waiting.values_list("tenant__slug", "expires_at"):
            left[slug].append((expires - now).total_seconds())
    except DatabaseError:
        return None
    family = HistogramMetricFamily(
        "cairn_approval_time_left_seconds",
        "Time left before each waiting approval request expires, per tenant.",
        labels=["tenant"],
    )
    for slug, seconds in sorted(left.items()):
        buckets = [(_le(b), sum(1 for s in seconds if s <= b)) for b in APPROVAL_BUCKETS]
        family.add_metric([slug], [*buckets, ("+Inf", len(seconds))], sum(seconds))
    return family


def _outbox_due(now: datetime) -> GaugeMetricFamily:
    due = (
        OutboxMessage.objects.filter(sent_at__isnull=True)
        .filter(Q(available_at__isnull=True) | Q(available_at__lte=now))
        .count()
    )
    return GaugeMetricFamily(
        "cairn_outbox_due_messages",
        "Outbox messages due and not yet published (the backlog).",
        value=due,
    )


def _commit_latency() -> HistogramMetricFamily:
    latency = latency_histogram()
    buckets = [(_le(bound), latency[f'le="{bound:g}"']) for bound in LATENCY_BUCKETS]
    return HistogramMetricFamily(
        COMMIT_LATENCY,
        "Duration of checkpoint commits, from every process.",
        buckets=[*buckets, ("+Inf", latency["count"])],
        sum_value=latency["sum"],
    )


def _retention_counter(name: str, help_text: str) -> CounterMetricFamily:
    # Declared under its ``_total`` name: prometheus-client strips the suffix from the
    # family and writes it back on the HELP, TYPE and sample lines, and adds no
    # ``_created`` sample since none is given.
    values = counter_values(name)
    family = CounterMetricFamily(name, help_text, labels=["kind"])
    for kind in RETENTION_KINDS:
        family.add_metric([kind], values.get(f'kind="{kind}"', 0.0))
    return family


class CairnCollector(Collector):
    """Every figure, read from the database when collected. A database that cannot be
    reached raises out of the scrape (the middleware answers 503 ``database_unavailable``)."""

    def __init__(self, *, now: datetime | None = None) -> None:
        self.now = now

    def collect(self) -> Iterator[Metric]:
        from retention.services import DELETED, DELETED_BYTES

        now = self.now or timezone.now()
        yield _runs()
        yield from _checkpoint_ages(now)
        yield from _restores()
        yield _stalled_operations(now)
        approvals = _approvals(now)
        if approvals is not None:
            yield approvals
        time_left = _approval_time_left(now)
        if time_left is not None:
            yield time_left
        yield GaugeMetricFamily(
            "cairn_outbox_lag_seconds",
            "Age of the oldest due outbox message not yet published.",
            value=outbox_lag_seconds(now),
        )
        yield _outbox_due(now)
        yield _dead_leases(now)
        yield _workers(now)
        yield _commit_latency()
        yield _retention_counter(DELETED, "Rows the retention job deleted, by kind.")
        yield _retention_counter(
            DELETED_BYTES,
            "Bytes the retention job deleted (checkpoint ciphertext, artifact content).",
        )


def metrics_text(*, now: datetime | None = None) -> str:
    """Every figure, as one exposition document (text format 0.0.4), read now."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(CairnCollector(now=now))
    return generate_latest(registry).decode()
