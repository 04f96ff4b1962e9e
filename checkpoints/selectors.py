"""Reads shared by the API and the console, with the tenant filter built in."""

from __future__ import annotations

from django.db.models import QuerySet

from checkpoints.models import Run
from tenants.models import Tenant


def runs_for_tenant(
    tenant: Tenant,
    *,
    status: str | None = None,
    state: str | None = None,
    workflow_type: str | None = None,
    paused: bool | None = None,
) -> QuerySet[Run]:
    runs = Run.objects.filter(tenant=tenant).select_related("forked_from_checkpoint")
    if paused is not None:  # an operator's hold (runtime.services.pause)
        runs = runs.filter(paused=paused)
    if status:
        runs = runs.filter(status=status)
    if state:
        runs = runs.filter(state=state)
    if workflow_type:
        runs = runs.filter(workflow_type=workflow_type)
    return runs
