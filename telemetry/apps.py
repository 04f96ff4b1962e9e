from django.apps import AppConfig


class TelemetryConfig(AppConfig):
    """Recording what happened, at the ground floor so the store and the engine can record:
    metric counters, commit-latency samples and the transition log. Serving them (``/metrics``,
    alerts) is the observability app's."""

    name = "telemetry"
    default_auto_field = "django.db.models.BigAutoField"
