"""Alerts an admin sees in the console: signs of a sick run before it hurts.

- a run restored more than CAIRN_ALERT_RESTORES times (a poison input, a crashing step);
- an operation pending for longer than CAIRN_STALLED_OPERATION_SECONDS (a side effect whose
  outcome nobody confirmed);
- outbox lag above CAIRN_ALERT_OUTBOX_LAG_SECONDS (commands are not reaching workers).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from uuid import UUID

from django.conf import settings
from django.utils import timezone

from checkpoints.models import Run
from observability.selectors import stalled_operations, tenant_outbox_lag_seconds
from tenants.models import Tenant

LIST_LIMIT = 20


@dataclass(frozen=True)
class Alert:
    kind: str  # "restores", "stalled_operation", "outbox_lag"
    message: str
    run_id: UUID | None = None


@dataclass(frozen=True)
class TenantAlerts:
    alerts: list[Alert]  # at most LIST_LIMIT of each kind
    count: int  # all of them

    def __len__(self) -> int:
        return self.count

    def __iter__(self):  # noqa: ANN204
        return iter(self.alerts)


def _restored(tenant: Tenant):  # noqa: ANN202
    return Run.objects.filter(tenant=tenant, restore_count__gt=settings.CAIRN_ALERT_RESTORES)


def alerts_for_tenant(tenant: Tenant, *, now: datetime | None = None) -> TenantAlerts:
    """The tenant's current alerts, most serious first. Reads only."""
    now = now or timezone.now()
    threshold = settings.CAIRN_ALERT_RESTORES
    alerts: list[Alert] = []
    count = 0
    lag = tenant_outbox_lag_seconds(tenant, now)
    if lag > settings.CAIRN_ALERT_OUTBOX_LAG_SECONDS:
        count += 1
        alerts.append(
            Alert(
                kind="outbox_lag",
                message=(
                    f"Commands wait {int(lag)} s to reach the workers (the bound is "
                    f"{settings.CAIRN_ALERT_OUTBOX_LAG_SECONDS} s): is the dispatcher running?"
                ),
            )
        )
    stalled = stalled_operations(tenant, now)
    count += stalled.count()
    fields = ("run_id", "action", "target", "created_at", "attempts")
    for op in stalled.order_by("created_at").only(*fields)[:LIST_LIMIT]:
        minutes = int((now - op.created_at).total_seconds() // 60)
        alerts.append(
            Alert(
                kind="stalled_operation",
                message=(
                    f"Operation {op.action} on {op.target} has been pending for {minutes} min "
                    f"over {op.attempts} attempt(s) with no confirmation; reconcile it."
                ),
                run_id=op.run_id,
            )
        )
    restored = _restored(tenant)
    count += restored.count()
    for run in restored.order_by("-restore_count", "pk").only(
        "pk", "workflow_type", "restore_count", "status"
    )[:LIST_LIMIT]:
        alerts.append(
            Alert(
                kind="restores",
                message=(
                    f"Run {str(run.pk)[:8]} ({run.workflow_type}, {run.status}) was restored "
                    f"{run.restore_count} times (more than {threshold})."
                ),
                run_id=run.pk,
            )
        )
    return TenantAlerts(alerts=alerts, count=count)
