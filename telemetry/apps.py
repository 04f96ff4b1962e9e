from django.apps import AppConfig


class TelemetryConfig(AppConfig):
    """Recording what happened, at the ground floor so the store and the engine can record:
    metric counters, commit-latency samples, the transition log and traces. Serving them
    (``/metrics``, alerts) is the observability app's."""

    name = "telemetry"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Every process that loads Django (web, worker, scheduler, commands) traces when the
        # OTEL_* environment says so, before the WSGI handler loads its middleware (the
        # Django instrumentation adds its own) and before any connection is opened.
        from telemetry.tracing import tracing_configure

        tracing_configure()
