"""Status changes the runtime makes without a new checkpoint."""

from __future__ import annotations

import logging
from uuid import UUID

from django.db import transaction
from django.db.models import F
from django.utils import timezone

from checkpoints.models import ACTIVE_STATUSES, Run, RunStatus
from checkpoints.services import outbox
from telemetry.logs import transition_log
from tenants.services import Actor, audit_record

log = logging.getLogger("cairn.runtime")


def run_pause_for_review(*, run_id: UUID, expected_version: int, reason: str, actor: Actor) -> bool:
    """Put the run in ``paused_for_review`` with ``reason`` and drop its lease.

    A pause records no new position, so it writes no checkpoint: the latest checkpoint may
    be the very thing that cannot be trusted or migrated. It bumps the run's version (any
    queued command becomes stale) and writes an audit event, in one transaction. Returns
    False (and writes nothing) when the run moved past ``expected_version`` or is no
    longer active.
    """
    with transaction.atomic():
        run = Run.objects.filter(pk=run_id).select_related("tenant").first()
        if run is None:
            return False
        updated = Run.objects.filter(
            pk=run_id, version=expected_version, status__in=ACTIVE_STATUSES
        ).update(
            status=RunStatus.PAUSED_FOR_REVIEW,
            status_reason=reason[:2000],
            version=F("version") + 1,
            lease_owner="",
            lease_expires_at=None,
            updated_at=timezone.now(),
        )
        if not updated:
            return False
        audit_record(
            tenant=run.tenant,
            actor=actor,
            action="run.paused_for_review",
            run_id=run.id,
            reason=reason[:2000],
        )
        transition_log(
            event="run paused for review",
            run_id=run.id,
            tenant=run.tenant.slug,
            sequence=run.checkpoint_sequence,
            state=run.state,
            step=run.step,
            status=RunStatus.PAUSED_FOR_REVIEW,
        )
    log.warning("run paused for review", extra={"run": str(run_id), "reason": reason})
    return True


def run_handover(*, run: Run, version: int, owner: str) -> bool:
    """Release this worker's lease and queue the run's next command, in one transaction,
    so another worker (or this one, later) continues. Returns False when the run moved on."""
    with transaction.atomic():
        released = Run.objects.filter(pk=run.pk, version=version, lease_owner=owner).update(
            lease_owner="", lease_expires_at=None
        )
        if not released:
            return False
        outbox.outbox_enqueue(
            run=run,
            kind="run.resume",
            payload={"run_id": str(run.pk), "expected_version": version},
        )
    return True
