from django.apps import AppConfig


class ObservabilityConfig(AppConfig):
    """Metrics, alerts and the structured-log checks. No models: the rows it needs live in
    the retention app (``MetricTotal``, ``CommitLatencySample``)."""

    name = "observability"
