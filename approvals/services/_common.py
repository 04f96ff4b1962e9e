"""Shared by the approval services: locks, the one place a request row is inserted."""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from uuid import UUID

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction
from django.utils import timezone

from approvals import signals
from approvals.models import LIVE_STATUSES, ApprovalRequest, ApprovalStatus
from approvals.services.standing import reviewers_declared
from cairn.errors import NotFound
from checkpoints.models import ACTIVE_STATUSES, Artifact, Checkpoint, Run, RunStatus
from checkpoints.services.checkpoints import CommitRequest, checkpoint_commit
from checkpoints.services.outbox import outbox_enqueue
from tenants import roles
from tenants.models import Tenant
from tenants.services import Actor, audit_record, permissions_of

log = logging.getLogger("cairn.approvals")


MAX_REQUIRED_APPROVALS = 20
MAX_COMMENT = 4000
RUN_OPEN_STATUSES = ACTIVE_STATUSES - {RunStatus.CANCELLING}


def default_expiry(now: datetime) -> datetime:
    return now + timedelta(seconds=settings.CAIRN_APPROVAL_TTL_SECONDS)


def send_after_commit(signal: object, **kwargs: object) -> None:
    def send() -> None:
        for receiver, result in signal.send_robust(sender=ApprovalRequest, **kwargs):
            if isinstance(result, Exception):
                log.error(
                    "approval notification receiver failed",
                    extra={"receiver": repr(receiver), "error": repr(result)},
                )

    transaction.on_commit(send)


def lock_run(*, tenant: Tenant, run_id: UUID | str) -> Run:
    try:
        return (
            Run.objects.select_for_update().select_related("workflow").get(tenant=tenant, pk=run_id)
        )
    except (Run.DoesNotExist, ValueError):
        raise NotFound("No such run.")


def request_insert(
    *,
    run: Run,
    artifact: Artifact,
    action: str,
    expires_at: datetime,
    required_approvals: int,
    requester: AbstractBaseUser | None,
    requester_label: str,
    actor: Actor,
    escalation_level: int = 0,
    reason: str = "",
    edited_from: Artifact | None = None,
    edited_by: AbstractBaseUser | None = None,
) -> ApprovalRequest:
    """Supersede the run's live request for ``action`` and insert a new one bound to the
    run's current version and checkpoint, decided by the reviewers the workflow declares
    for it and needing at least its declared quorum (``reviewers_declared``). ``edited_from``
    and ``edited_by``: ``artifact`` is a reviewer's edit of that artifact (approve with
    edits). Call inside a transaction holding the run lock."""
    now = timezone.now()
    declared = reviewers_declared(run=run, action=action, level=escalation_level)
    required_approvals = max(required_approvals, declared.quorum)
    previous = ApprovalRequest.objects.filter(run=run).order_by("-created_at", "-pk").first()
    live = list(ApprovalRequest.objects.filter(run=run, action=action, status__in=LIVE_STATUSES))
    for old in live:
        ApprovalRequest.objects.filter(pk=old.pk).update(
            status=ApprovalStatus.SUPERSEDED,
            status_reason=(
                f"Replaced by a new request for artifact {artifact.sha256[:12]} "
                f"at run version {run.version}."
            ),
        )
        audit_record(
            tenant=run.tenant,
            actor=actor,
            action="approval.superseded",
            run_id=run.id,
            target=str(old.pk),
            details={"artifact_sha256": old.artifact_sha256, "run_version": old.run_version},
        )
    request = ApprovalRequest.objects.create(
        tenant_id=run.tenant_id,
        run=run,
        run_version=run.version,
        checkpoint_id=run.latest_checkpoint_id,
        checkpoint_sequence=run.checkpoint_sequence,
        checkpoint_sha256=run.latest_checkpoint_sha256,
        artifact=artifact,
        artifact_sha256=artifact.sha256,
        action=action,
        requester=requester if requester is not None and requester.pk else None,
        requester_label=requester_label[:200] or "system",
        required_approvals=required_approvals,
        reviewer_role=declared.role,
        reviewer_group=declared.group,
        escalation_level=escalation_level,
        status_reason=reason,
        expires_at=expires_at,
        previous=previous,
        edited_from=edited_from,
        edited_from_sha256=edited_from.sha256 if edited_from is not None else "",
        edited_by=edited_by,
    )
    audit_record(
        tenant=run.tenant,
        actor=actor,
        action="approval.requested",
        run_id=run.id,
        target=str(request.pk),
        details={
            "action": action,
            "artifact_id": str(artifact.pk),
            "artifact_sha256": artifact.sha256,
            "run_version": run.version,
            "expires_at": expires_at.isoformat(),
            "required_approvals": required_approvals,
            "reviewers": {"role": declared.role, "group": declared.group},
            "escalation_level": escalation_level,
            "supersedes": [str(old.pk) for old in live],
            "edited_from_sha256": edited_from.sha256 if edited_from is not None else None,
        },
    )
    log.info(
        "approval requested",
        extra={"run": str(run.id), "request": str(request.pk), "action": action, "at": str(now)},
    )
    # Its reviewers are told through the outbox (``approvals.notify``), in this transaction.
    outbox_enqueue(
        run=run,
        kind="approval.notify",
        payload={
            "request_id": str(request.pk),
            "event": "escalated" if escalation_level else "requested",
        },
    )
    send_after_commit(signals.approval_requested, request=request)
    return request


def run_starter(run: Run) -> AbstractBaseUser | None:
    """The member who started the run (its genesis checkpoint's actor), if a person did.

    Requests a workflow raises on its own are attributed to them, so the person who asked
    for the work cannot approve its publication.
    """
    name = (
        Checkpoint.objects.filter(run_id=run.pk, sequence=1).values_list("actor", flat=True).first()
    )
    if not name:
        return None
    user = get_user_model().objects.filter(username=name).first()
    if user is None or not permissions_of(user=user, tenant=run.tenant):
        return None
    return user


def may_review(*, user: AbstractBaseUser, tenant: Tenant) -> bool:
    """The user may review some runs of the tenant: every run, or those granted to them
    (``review_scope`` says which)."""
    return bool(set(roles.REVIEWERS) & permissions_of(user=user, tenant=tenant))


def request_raise_again(
    *, request: ApprovalRequest, run: Run, actor: Actor, escalation_level: int, reason: str = ""
) -> ApprovalRequest:
    """A new request in place of ``request`` (renewed after an expiry, or escalated to the
    next level): the same artifact (an edit stays an edit), action, requester and quorum,
    a fresh expiry."""
    return request_insert(
        run=run,
        artifact=request.artifact,
        action=request.action,
        expires_at=default_expiry(timezone.now()),
        required_approvals=request.required_approvals,
        requester=request.requester,
        requester_label=request.requester_label,
        actor=actor,
        escalation_level=escalation_level,
        reason=reason,
        edited_from=request.edited_from,
        edited_by=request.edited_by,
    )


def run_fail_at_approval(
    *, request: ApprovalRequest, run: Run, actor: Actor, reason: str, status_reason: str
) -> None:
    """End an externally driven run where it waits on ``request``: a failed checkpoint at
    its approval state recording the request and the reason (worker runs go where their
    workflow code says instead).

    A person's decision (or the workflow's declared end of an escalation) outranks the lease
    of whoever drives the run (the optimistic version check still guards the race), so the
    commit names the current lease owner."""
    checkpoint_commit(
        tenant=run.tenant,
        run_id=run.pk,
        request=CommitRequest(
            expected_version=run.version,
            state=run.state,
            step=run.step,
            envelope={
                "control": {
                    "approval_request_id": str(request.pk),
                    "actor": actor.name,
                    "reason": reason[:2000],
                }
            },
            actor=actor,
            status=RunStatus.FAILED,
            status_reason=status_reason[:2000],
            lease_owner=run.lease_owner or None,
            is_evidence=True,
        ),
    )
