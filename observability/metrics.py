"""The figures served at ``/metrics``, in the Prometheus text exposition format (0.0.4).

Written by hand: a few gauges, counters and histograms computed from the database on each
scrape, so every web process serves the same numbers whichever process did the work.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable
from datetime import datetime

from django.apps import apps
from django.conf import settings
from django.db import DatabaseError
from django.db.models import Count, Max, Q, Sum
from django.utils import timezone

from checkpoints.models import (
    ACTIVE_STATUSES,
    Checkpoint,
    ExternalOperation,
    OperationStatus,
    Run,
    RunStatus,
)
from checkpoints.services.outbox import outbox_lag_seconds
from observability.counters import counter_values
from observability.latency import BUCKETS as LATENCY_BUCKETS
from observability.latency import COMMIT_LATENCY, latency_histogram
from observability.selectors import stalled_before

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
AGE_BUCKETS = (60, 300, 900, 3600, 6 * 3600, 86400, 7 * 86400)
RETENTION_KINDS = ("checkpoint", "artifact", "run")

Labels = dict[str, str]


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _labels(labels: Labels) -> str:
    if not labels:
        return ""
    return "{" + ",".join(f'{k}="{_escape(str(v))}"' for k, v in labels.items()) + "}"


def _number(value: float) -> str:
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if float(value).is_integer():
        return str(int(value))
    return repr(float(value))


class Exposition:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def family(
        self, name: str, kind: str, help_text: str, samples: Iterable[tuple[Labels, float]]
    ) -> None:
        self.lines.append(f"# HELP {name} {help_text}")
        self.lines.append(f"# TYPE {name} {kind}")
        for labels, value in samples:
            self.lines.append(f"{name}{_labels(labels)} {_number(value)}")

    def histogram(
        self,
        name: str,
        help_text: str,
        cumulative: Iterable[tuple[float, float]],
        count: float,
        total: float,
    ) -> None:
        self.lines.append(f"# HELP {name} {help_text}")
        self.lines.append(f"# TYPE {name} histogram")
        for bound, value in cumulative:
            self.lines.append(f'{name}_bucket{{le="{_number(bound)}"}} {_number(value)}')
        self.lines.append(f'{name}_bucket{{le="+Inf"}} {_number(count)}')
        self.lines.append(f"{name}_sum {_number(total)}")
        self.lines.append(f"{name}_count {_number(count)}")

    def text(self) -> str:
        return "\n".join(self.lines) + "\n"


def _runs_by_status() -> list[tuple[Labels, float]]:
    counts: dict[str, dict[str, int]] = defaultdict(dict)
    for slug, status, n in (
        Run.objects.values_list("tenant__slug", "status").annotate(n=Count("id")).order_by()
    ):
        counts[slug][status] = n
    return [
        ({"tenant": slug, "status": status}, by_status.get(status, 0))
        for slug, by_status in sorted(counts.items())
        for status in RunStatus.values
    ]


def _checkpoint_ages(now: datetime) -> tuple[list[tuple[float, float]], int, float]:
    latest = Run.objects.filter(status__in=ACTIVE_STATUSES).values("latest_checkpoint_id")
    ages = [
        max(0.0, (now - created).total_seconds())
        for created in Checkpoint.objects.filter(pk__in=latest).values_list("created_at", flat=True)
    ]
    cumulative = [(bound, sum(1 for age in ages if age <= bound)) for bound in AGE_BUCKETS]
    return cumulative, len(ages), sum(ages)


def _stalled_operations() -> list[tuple[Labels, float]]:
    rows = (
        ExternalOperation.objects.filter(
            status=OperationStatus.PENDING, created_at__lt=stalled_before()
        )
        .values_list("tenant__slug")
        .annotate(n=Count("id"))
        .order_by()
    )
    return [({"tenant": slug}, n) for slug, n in rows]


def _approvals(now: datetime) -> list[tuple[Labels, float]] | None:
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
    samples: list[tuple[Labels, float]] = []
    for slug, waiting_n, expired_n in sorted(rows):
        samples.append(({"tenant": slug, "state": "waiting"}, waiting_n))
        samples.append(({"tenant": slug, "state": "expired"}, expired_n))
    return samples


def _counter(name: str) -> list[tuple[Labels, float]]:
    values = counter_values(name)
    return [({"kind": kind}, values.get(f'kind="{kind}"', 0.0)) for kind in RETENTION_KINDS]


def metrics_text(*, now: datetime | None = None) -> str:
    """Every figure, as one exposition document."""
    from retention.services import DELETED, DELETED_BYTES

    now = now or timezone.now()
    out = Exposition()
    out.family("cairn_runs", "gauge", "Runs by tenant and status.", _runs_by_status())
    cumulative, count, total = _checkpoint_ages(now)
    out.histogram(
        "cairn_active_checkpoint_age_seconds",
        "Age of the latest checkpoint of each active run.",
        cumulative,
        count,
        total,
    )
    restores = Run.objects.aggregate(total=Sum("restore_count"), most=Max("restore_count"))
    out.family(
        "cairn_restores_total",
        "counter",
        "Restores of all runs (a worker took over a run whose lease expired).",
        [({}, restores["total"] or 0)],
    )
    out.family(
        "cairn_run_restores_max",
        "gauge",
        "The most restores of any one run.",
        [({}, restores["most"] or 0)],
    )
    out.family(
        "cairn_stalled_operations",
        "gauge",
        f"Operations pending for more than {settings.CAIRN_STALLED_OPERATION_SECONDS} seconds.",
        _stalled_operations(),
    )
    approvals = _approvals(now)
    if approvals is not None:
        out.family("cairn_approvals", "gauge", "Approval requests waiting and expired.", approvals)
    out.family(
        "cairn_outbox_lag_seconds",
        "gauge",
        "Age of the oldest due outbox message not yet published.",
        [({}, outbox_lag_seconds())],
    )
    latency = latency_histogram()
    out.histogram(
        COMMIT_LATENCY,
        "Duration of checkpoint commits, from every process.",
        [(bound, latency[f'le="{bound:g}"']) for bound in LATENCY_BUCKETS],
        latency["count"],
        latency["sum"],
    )
    out.family(DELETED, "counter", "Rows the retention job deleted, by kind.", _counter(DELETED))
    out.family(
        DELETED_BYTES,
        "counter",
        "Bytes the retention job deleted (checkpoint ciphertext, artifact content).",
        _counter(DELETED_BYTES),
    )
    return out.text()
