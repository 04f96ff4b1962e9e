from django.apps import AppConfig


class ObservabilityConfig(AppConfig):
    """Metrics, alerts and the console's alert list. No models: the rows it serves are
    recorded by the telemetry app (``MetricTotal``, ``MetricIncrement``,
    ``CommitLatencySample``)."""

    name = "observability"

    def ready(self) -> None:
        from observability import checks  # noqa: F401
