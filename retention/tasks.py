from celery import shared_task

from retention.services import retention_apply
from runtime.heartbeats import heartbeat_start
from scheduling.services import periodic_job_run


@shared_task(name="retention.apply")
def apply_retention() -> dict | None:
    """The retention job, claimed so two schedulers run it once (None when skipped)."""
    return periodic_job_run(
        name="retention.apply",
        job=lambda: retention_apply().as_dict(),
        holder=heartbeat_start(),
    )
