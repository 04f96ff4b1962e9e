"""Reads shared by the metrics, the alerts and the console badge."""

from __future__ import annotations

from datetime import datetime, timedelta

from django.conf import settings
from django.db.models import Q, QuerySet
from django.utils import timezone

from checkpoints.models import ExternalOperation, OperationStatus, OutboxMessage
from tenants.models import Tenant


def stalled_before(now: datetime | None = None) -> datetime:
    return (now or timezone.now()) - timedelta(seconds=settings.CAIRN_STALLED_OPERATION_SECONDS)


def stalled_operations(tenant: Tenant, now: datetime | None = None) -> QuerySet[ExternalOperation]:
    """The tenant's operations pending for longer than CAIRN_STALLED_OPERATION_SECONDS,
    counted from the first attempt (the reservation): every retry bumps ``updated_at``, so an
    operation retried without end would otherwise never look stalled."""
    return ExternalOperation.objects.filter(
        tenant=tenant, status=OperationStatus.PENDING, created_at__lt=stalled_before(now)
    )


def tenant_outbox_lag_seconds(tenant: Tenant, now: datetime | None = None) -> float:
    """Age of the tenant's oldest due, unsent outbox message (0 when drained)."""
    now = now or timezone.now()
    oldest = (
        OutboxMessage.objects.filter(tenant=tenant, sent_at__isnull=True)
        .filter(Q(available_at__isnull=True) | Q(available_at__lte=now))
        .order_by("id")
        .values_list("created_at", "available_at")
        .first()
    )
    if oldest is None:
        return 0.0
    created, available = oldest
    return max(0.0, (now - max(created, available or created)).total_seconds())
