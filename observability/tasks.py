from celery import shared_task

from observability.counters import counters_rollup
from observability.latency import latency_rollup


@shared_task(name="observability.metrics_rollup")
def metrics_rollup() -> dict[str, int]:
    return {"increments": counters_rollup(), "latency_samples": latency_rollup()}
