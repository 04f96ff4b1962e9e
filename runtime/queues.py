"""What is waiting to be worked on: commands in the outbox, messages in the broker's queue,
and the runs waiting for a retry. Reads for the health page (console/views/health.py)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from django.conf import settings
from django.db.models import Q, QuerySet
from django.utils import timezone

from checkpoints.models import OutboxMessage, Run, RunStatus
from checkpoints.services.outbox import TASK_FOR_KIND
from tenants.models import Tenant

BROKER_TIMEOUT_SECONDS = 2.0


@dataclass(frozen=True)
class QueueBacklog:
    """One queue's backlog: the broker's count of waiting messages (None when the broker
    did not answer, with ``error`` saying so), and, in front of it, the outbox's commands
    that are due but not yet published, those held for paused runs, and the age of the
    oldest due one."""

    name: str
    broker: str  # the transport: filesystem, redis, amqp, memory…
    waiting: int | None
    error: str
    outbox_due: int
    outbox_held: int
    outbox_lag_seconds: float


def _broker_waiting(name: str) -> tuple[str, int | None, str]:
    """The broker's count of messages waiting in queue ``name`` (a passive declare: the same
    call on every supported transport). A queue the broker does not know yet holds none."""
    from kombu.exceptions import ChannelError, OperationalError

    from cairn.celery import app

    try:
        with app.connection_for_read() as connection:
            transport = connection.transport_cls
            connection.ensure_connection(max_retries=1, timeout=BROKER_TIMEOUT_SECONDS)
            try:
                declared = connection.default_channel.queue_declare(queue=name, passive=True)
            except ChannelError:
                return str(transport), 0, ""  # never declared (or emptied and removed)
            return str(transport), int(declared.message_count), ""
    except (OperationalError, OSError, TimeoutError) as exc:
        return "", None, f"the broker did not answer ({type(exc).__name__})"
    except Exception as exc:  # noqa: BLE001 - a page must say so, never fail on it
        if type(exc).__name__ in {"NotFound", "ChannelError"}:  # amqp's passive miss
            return "", 0, ""
        return "", None, f"the broker did not answer ({type(exc).__name__})"


def queues_backlog(*, tenant: Tenant, now: datetime | None = None) -> list[QueueBacklog]:
    """The backlog of each queue Cairn publishes to (one today: ``CAIRN_TASK_QUEUE``): the
    broker's count is the queue's (every tenant's messages); the outbox figures are the
    tenant's own commands."""
    now = now or timezone.now()
    commands = OutboxMessage.objects.filter(
        tenant=tenant, kind__in=list(TASK_FOR_KIND), sent_at__isnull=True
    )
    due = commands.filter(Q(available_at__isnull=True) | Q(available_at__lte=now))
    ready = due.exclude(run__paused=True)
    oldest = ready.order_by("id").values_list("created_at", "available_at").first()
    lag = 0.0
    if oldest is not None:
        created, available = oldest
        lag = max(0.0, (now - max(created, available or created)).total_seconds())
    name = settings.CELERY_TASK_DEFAULT_QUEUE
    broker, waiting, error = _broker_waiting(name)
    return [
        QueueBacklog(
            name=name,
            broker=broker or settings.CELERY_BROKER_URL.split(":", 1)[0],
            waiting=waiting,
            error=error,
            outbox_due=ready.count(),
            outbox_held=due.filter(run__paused=True).count(),
            outbox_lag_seconds=lag,
        )
    ]


def runs_waiting_retry(*, tenant: Tenant) -> QuerySet[Run]:
    """The tenant's runs waiting for a retry, soonest due first, each with what the health
    page shows: its next retry time, attempts used and limit, and the last failure (the
    status reason the retry was scheduled with)."""
    return (
        Run.objects.filter(tenant=tenant, status=RunStatus.WAITING_RETRY)
        .only(
            "id",
            "workflow_type",
            "state",
            "step",
            "next_eligible_at",
            "budget_used",
            "budget_limits",
            "status_reason",
            "paused",
        )
        .order_by("next_eligible_at", "id")
    )
