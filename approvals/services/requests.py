"""Asking for approval: a request bound to the run version, checkpoint and artifact."""

from __future__ import annotations

from datetime import datetime
from uuid import UUID

from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction
from django.utils import timezone

from approvals.models import ApprovalRequest
from approvals.services._common import (
    MAX_REQUIRED_APPROVALS,
    RUN_OPEN_STATUSES,
    default_expiry,
    lock_run,
    request_insert,
)
from approvals.services.standing import uuid_or_none
from cairn.credentials import free_text_refuse
from cairn.errors import ArtifactHashMismatch, InvalidRequest, RunNotActive
from checkpoints.models import Artifact
from tenants.models import Tenant
from tenants.services import Actor


def approval_request_create(
    *,
    tenant: Tenant,
    run_id: UUID | str,
    artifact_id: UUID | str,
    artifact_sha256: str,
    action: str,
    actor: Actor,
    expires_at: datetime | None = None,
    required_approvals: int = 1,
    requester: AbstractBaseUser | None = None,
) -> ApprovalRequest:
    """Ask for approval of ``action`` on one artifact, bound to the run's current version.

    Atomic: a live request of the run for the same action is superseded in the same
    transaction, so at most one request per run and action can ever let the run continue.
    ``requester`` defaults to the acting user (who then may not approve it).

    Raises NotFound (run), RunNotActive, ArtifactHashMismatch (422: the artifact is not in
    the tenant or is stored with another sha256) or InvalidRequest.
    """
    action = (action or "").strip()
    free_text_refuse({"action": action})
    problems: dict[str, str] = {}
    if not action or len(action) > 100:
        problems["action"] = "1-100 characters, e.g. publish"
    if (
        not isinstance(required_approvals, int)
        or isinstance(required_approvals, bool)
        or not 1 <= required_approvals <= MAX_REQUIRED_APPROVALS
    ):
        problems["required_approvals"] = f"a whole number from 1 to {MAX_REQUIRED_APPROVALS}"
    now = timezone.now()
    expires_at = expires_at or default_expiry(now)
    if timezone.is_naive(expires_at):
        problems["expires_at"] = "a timestamp with a time zone"
    elif expires_at <= now:
        problems["expires_at"] = "must be in the future"
    if problems:
        raise InvalidRequest("The approval request is not valid.", fields=problems)
    if requester is None and actor.user is not None and actor.user.is_authenticated:
        requester = actor.user
    with transaction.atomic():
        run = lock_run(tenant=tenant, run_id=run_id)
        if run.status not in RUN_OPEN_STATUSES:
            raise RunNotActive(f"The run is {run.status}; it cannot ask for approval.")
        artifact = Artifact.objects.filter(tenant=tenant, pk=uuid_or_none(artifact_id)).first()
        if artifact is None:
            raise ArtifactHashMismatch(
                f"Artifact {artifact_id} does not exist in this tenant.",
                fields={"artifact_id": "unknown"},
            )
        if artifact.sha256 != artifact_sha256:
            raise ArtifactHashMismatch(
                f"Artifact {artifact.pk} is stored with sha256 {artifact.sha256}, "
                f"not {artifact_sha256}.",
                fields={"artifact_sha256": "does not match the stored artifact"},
            )
        return request_insert(
            run=run,
            artifact=artifact,
            action=action,
            expires_at=expires_at,
            required_approvals=required_approvals,
            requester=requester,
            requester_label=requester.get_username() if requester else actor.name,
            actor=actor,
        )
