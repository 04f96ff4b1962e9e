"""Persisted counters: append-only increments, folded into totals by the rollup."""

from __future__ import annotations

from collections import defaultdict

from django.db import transaction
from django.db.models import F, Sum

from telemetry.models import MetricIncrement, MetricTotal

ROLLUP_LOCK = "cairn_rollup_lock"


def counter_values(name: str) -> dict[str, float]:
    """``{labels: value}`` of one counter: the folded total plus increments not folded yet."""
    values: dict[str, float] = defaultdict(float)
    for labels, value in MetricTotal.objects.filter(name=name).values_list("labels", "value"):
        values[labels] += value
    increments = (
        MetricIncrement.objects.filter(name=name)
        .values("labels")
        .annotate(total=Sum("value"))
        .values_list("labels", "total")
    )
    for labels, value in increments:
        values[labels] += value or 0.0
    return dict(values)


def counters_rollup(*, limit: int = 10_000) -> int:
    """Fold up to ``limit`` increments into the totals. Atomic; concurrent rollups serialize
    on one lock row, and each increment is folded exactly once (one explicit id list)."""
    with transaction.atomic():
        MetricTotal.objects.get_or_create(name=ROLLUP_LOCK, labels="")
        MetricTotal.objects.select_for_update().get(name=ROLLUP_LOCK, labels="")
        rows = list(
            MetricIncrement.objects.order_by("id").values_list("id", "name", "labels", "value")[
                :limit
            ]
        )
        if not rows:
            return 0
        sums: dict[tuple[str, str], float] = defaultdict(float)
        for _, name, labels, value in rows:
            sums[(name, labels)] += value
        for (name, labels), value in sums.items():
            MetricTotal.objects.get_or_create(name=name, labels=labels)
            MetricTotal.objects.filter(name=name, labels=labels).update(value=F("value") + value)
        MetricIncrement.objects.filter(id__in=[row[0] for row in rows]).delete()
    return len(rows)
