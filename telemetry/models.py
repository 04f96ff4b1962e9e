"""The rows metrics are recorded in: counter totals, counter increments, latency samples.

The tables were created by the retention app and keep their names (``db_table``): the
models moved here, with a state-only migration, so that the store can record commit latency
without depending on retention.
"""

from __future__ import annotations

from django.db import models
from django.db.models import Q


class MetricTotal(models.Model):
    """A persisted monotonic counter: the rolled-up sum of ``MetricIncrement`` rows and of
    commit latency samples. Only the rollup writes it, under a row lock."""

    name = models.CharField(max_length=100)
    labels = models.CharField(max_length=200, blank=True)  # 'le="0.05"', 'kind="checkpoint"'
    value = models.FloatField(default=0)

    class Meta:
        db_table = "retention_metrictotal"
        constraints = [models.UniqueConstraint(fields=["name", "labels"], name="metric_total_once")]

    def __str__(self) -> str:
        return f"{self.name}{{{self.labels}}} {self.value}"


class MetricIncrement(models.Model):
    """One addition to a counter, appended in the transaction that did the counted work.

    Append-only, so concurrent retention jobs never queue on a shared counter row, and a
    killed job's increment rolls back with the work it counted.
    """

    id = models.BigAutoField(primary_key=True)
    name = models.CharField(max_length=100)
    labels = models.CharField(max_length=200, blank=True)
    value = models.FloatField()
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        db_table = "retention_metricincrement"

    def __str__(self) -> str:
        return f"{self.name}{{{self.labels}}} +{self.value}"


class CommitLatencySample(models.Model):
    """One checkpoint commit's duration, appended by whichever process committed.

    A table rather than a process-local histogram, so ``/metrics`` served by one web
    process sees commits made by every worker. The metrics rollup folds old samples into
    ``MetricTotal`` buckets and deletes them, so the table stays small.
    """

    id = models.BigAutoField(primary_key=True)
    seconds = models.FloatField()
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        db_table = "retention_commitlatencysample"
        indexes = [models.Index(fields=["created_at"], name="latency_created_idx")]
        constraints = [models.CheckConstraint(condition=Q(seconds__gte=0), name="latency_positive")]

    def __str__(self) -> str:
        return f"{self.seconds:.4f}s"
