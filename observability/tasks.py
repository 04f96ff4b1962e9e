from celery import shared_task

from runtime.heartbeats import heartbeat_start
from scheduling.services import periodic_job_run
from telemetry.counters import counters_rollup
from telemetry.latency import latency_rollup


def _rollup() -> dict[str, int]:
    return {"increments": counters_rollup(), "latency_samples": latency_rollup()}


@shared_task(name="observability.metrics_rollup")
def metrics_rollup() -> dict[str, int] | None:
    """Claimed so two schedulers roll up once per interval (None when skipped)."""
    return periodic_job_run(
        name="observability.metrics_rollup", job=_rollup, holder=heartbeat_start()
    )
