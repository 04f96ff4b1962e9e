"""Reads shared by the API and the console, with the tenant filter built in."""

from __future__ import annotations

from uuid import UUID

from django.db.models import QuerySet

from checkpoints.models import Run
from tenants.models import Tenant

RUN_ID_PREFIX_MIN = 4


def run_id_prefix_bounds(text: str) -> tuple[UUID, UUID] | None:
    """The lowest and highest run id that start with ``text`` as people copy it from a table
    (a full id, or at least RUN_ID_PREFIX_MIN hex digits; dashes ignored), for a primary-key
    range the index answers on every database (no text cast of the uuid). None when ``text``
    is no such prefix."""
    compact = str(text).strip().lower().replace("-", "")
    if not RUN_ID_PREFIX_MIN <= len(compact) <= 32 or any(
        c not in "0123456789abcdef" for c in compact
    ):
        return None
    return UUID(compact.ljust(32, "0")), UUID(compact.ljust(32, "f"))


def runs_for_tenant(
    tenant: Tenant,
    *,
    status: str | None = None,
    state: str | None = None,
    workflow_type: str | None = None,
) -> QuerySet[Run]:
    runs = Run.objects.filter(tenant=tenant).select_related("forked_from_checkpoint")
    if status:
        runs = runs.filter(status=status)
    if state:
        runs = runs.filter(state=state)
    if workflow_type:
        runs = runs.filter(workflow_type=workflow_type)
    return runs
