from celery import shared_task

from retention.services import retention_apply


@shared_task(name="retention.apply")
def apply_retention() -> dict:
    return retention_apply().as_dict()
