"""Using an approval: the worker's gate at an approval state (restore step 6) and the commit
that leaves it, which consumes it once, for the bound version, action and hash. Which
request counts is ``approval_standing``'s to say, for both."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any
from uuid import UUID

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from approvals.models import LIVE_STATUSES, ApprovalRequest, ApprovalStatus
from approvals.services._common import lock_run, request_insert, run_starter
from approvals.services.expiry import after_expiry, escalate, expire_request
from approvals.services.standing import (
    ApprovalAsk,
    approval_standing,
    edited_shas,
    request_judge,
    uuid_or_none,
)
from cairn.errors import ApprovalClosed, ArtifactHashMismatch, NotFound
from checkpoints.approvals_port import ApprovalUse, CommitRun
from checkpoints.models import Artifact, Checkpoint, Run
from tenants.services import Actor, audit_record


def approval_commit_check(
    *, run: CommitRun, action: str, state: str, evidence: dict[str, Any], control: dict[str, Any]
) -> ApprovalUse | None:
    """The approval that lets a commit leave the approval state ``run.state`` for ``state``
    (``run`` as the commit read it): the one ``approval_standing`` finds for ``run.version``,
    ``action`` and an artifact ``evidence`` names (``control.approval_request_id`` names
    it, else the newest that counts). Reads only.

    Returns the request the commit must consume in its transaction (``approval_consume``),
    or None when it was consumed for this same version already (the same one use). Raises
    ApprovalRequired (none, another action, pending or rejected), ApprovalStale,
    ApprovalHashMismatch, ApprovalExpired or ApprovalClosed.
    """
    shas = {ref.get("sha256") for ref in evidence.get("artifacts") or []}
    ask = ApprovalAsk(
        run_id=run.id,
        version=run.version,
        action=action,
        artifact_sha256s=shas,
        place=f"Leaving the approval state '{run.state}' for '{state}'",
    )
    standing = approval_standing(ask=ask, request_id=control.get("approval_request_id"))
    if standing.refusal is not None:
        raise standing.refusal
    request = standing.request
    if standing.verdict == "used":
        return None
    return ApprovalUse(request.pk, request.action, request.artifact_sha256)


def approval_consume(
    *, run: Run, request_id: UUID | str, action: str, artifact_sha256: str, actor: Actor
) -> ApprovalRequest:
    """Use an approved request to let the run continue: exactly once, and only for the run's
    current version, the action and the artifact sha256 it names, before its expiry.

    One conditional UPDATE (approved → consumed); call it inside the transaction that moves
    the run past its approval state, so the approval is used if and only if the run moves.
    Raises NotFound, ApprovalExpired (and marks the request expired), ApprovalStale,
    ApprovalRequired (another action), ApprovalHashMismatch or ApprovalClosed (not
    approved, or already consumed).
    """
    now = timezone.now()
    with transaction.atomic():
        used = ApprovalRequest.objects.filter(
            pk=uuid_or_none(request_id),
            run=run,
            status=ApprovalStatus.APPROVED,
            expires_at__gt=now,
            run_version=run.version,
            action=action,
            artifact_sha256=artifact_sha256,
        ).update(status=ApprovalStatus.CONSUMED, consumed_at=now)
        request = (
            ApprovalRequest.objects.select_related("tenant", "artifact", "requester")
            .filter(pk=uuid_or_none(request_id), run=run)
            .first()
        )
        if request is None:
            raise NotFound("No such approval request for this run.")
        if used:
            audit_record(
                tenant=request.tenant,
                actor=actor,
                action="approval.consumed",
                run_id=run.id,
                target=str(request.pk),
                details={"action": action, "artifact_sha256": artifact_sha256},
            )
            return request
        ask = ApprovalAsk(
            run_id=run.pk, version=run.version, action=action, artifact_sha256s={artifact_sha256}
        )
        verdict, error = request_judge(request, ask, now)
        if error is None:  # approved a moment ago and used since, by the race's winner
            error = ApprovalClosed(f"Approval request {request.pk} is {request.status}.")
        if verdict == "expired":
            expire_request(request=request, actor=actor, renew=False)
    raise error  # after the block, so an expiry found here stays recorded


@dataclass(frozen=True)
class GateVerdict:
    """The answer at an approval state: continue now, keep waiting, or stop.

    ``outcome`` is "approved" (proceed; the approval was consumed), "waiting" (a request is
    open; ``request`` is it, possibly raised just now), "rejected" (``reason`` is the
    reviewer's comment) or "expired" (only when the workflow names a state for expiry).
    """

    outcome: str
    request: ApprovalRequest | None
    reason: str = ""

    @property
    def proceed(self) -> bool:
        return self.outcome == "approved"


def approval_gate(
    *,
    run: Run,
    action: str,
    artifact_id: UUID | str,
    artifact_sha256: str,
    actor: Actor,
    expires_in: timedelta | None = None,
    required_approvals: int = 1,
    on_expiry: str | None = None,
) -> GateVerdict:
    """Restore step 6 at an approval state: may the run continue past it now?

    Asks ``approval_standing`` for the run's current version, ``action`` and the current
    artifact's sha256: an approved, unexpired request there answers "approved" (the commit
    that moves the run consumes it, in its own transaction); a pending one "waiting"; a
    reject "rejected". An expired one is marked expired and, unless the workflow names an
    ``on_expiry`` state (outcome "expired"), replaced by a fresh request. Anything else (no
    request yet, one for another artifact, version or action) raises a fresh request,
    attributed to the member who started the run; it supersedes the live one.

    Atomic, with the run's row locked. Raises NotFound or ArtifactHashMismatch (the
    artifact is not stored with that sha256).
    """
    now = timezone.now()
    with transaction.atomic():
        run = lock_run(tenant=run.tenant, run_id=run.pk)
        artifact = Artifact.objects.filter(tenant_id=run.tenant_id, pk=artifact_id).first()
        if artifact is None or artifact.sha256 != artifact_sha256:
            raise ArtifactHashMismatch(
                f"The artifact under review ({artifact_id}) is not stored with sha256 "
                f"{artifact_sha256}."
            )
        # The draft under review, or a reviewer's edit of it (approve with edits): the run
        # continues with the edited artifact (``restore_approval_outcome`` hands it over).
        shas = edited_shas(
            run_id=run.pk, version=run.version, action=action, sha256=artifact_sha256
        )
        ask = ApprovalAsk(run_id=run.pk, version=run.version, action=action, artifact_sha256s=shas)
        standing = approval_standing(ask=ask, now=now)
        request = standing.request
        if standing.verdict == "used":
            # Consumed by an earlier Cairn's gate, yet the run is still at the bound version:
            # the commit that was to move it on failed. Still that one use; once the run
            # moves, the version no longer matches and it can never count again.
            audit_record(
                tenant=run.tenant,
                actor=actor,
                action="approval.consume_resumed",
                run_id=run.id,
                target=str(request.pk),
                details={"run_version": run.version, "artifact_sha256": artifact_sha256},
            )
        if standing.counts:
            return GateVerdict("approved", request)
        if standing.verdict == "pending":
            return GateVerdict("waiting", request)
        if standing.verdict == "rejected":
            return GateVerdict("rejected", request, request.status_reason)
        if standing.verdict == "expired":
            was = request.status
            if request.status in LIVE_STATUSES:
                expire_request(request=request, actor=actor, renew=False)
                if on_expiry:
                    return GateVerdict(
                        "expired",
                        request,
                        f"The approval request expired at {request.expires_at}.",
                    )
            elif request.decided_at is None:
                was = ApprovalStatus.PENDING  # expired by the sweep with no decision
            # A declared escalation decides what follows, here as in the sweep.
            after = after_expiry(request=request, run=run, was=was)
            if after.kind == "hold":
                return GateVerdict("waiting", request, after.reason)
            if after.kind == "fail":
                return GateVerdict("rejected", request, after.reason)
            if after.kind == "escalate":
                live = ApprovalRequest.objects.filter(
                    run=run, action=action, status__in=LIVE_STATUSES
                ).first()
                if live is not None:
                    return GateVerdict("waiting", live)
                return GateVerdict(
                    "waiting", escalate(request=request, run=run, actor=actor, after=after)
                )
        starter = run_starter(run)
        # Who asked for the work: the member who started the run, else the process that did.
        started_by = (
            Checkpoint.objects.filter(run_id=run.pk, sequence=1)
            .values_list("actor", flat=True)
            .first()
        )
        fresh = request_insert(
            run=run,
            artifact=artifact,
            action=action,
            expires_at=now + (expires_in or timedelta(seconds=settings.CAIRN_APPROVAL_TTL_SECONDS)),
            required_approvals=required_approvals,
            requester=starter,
            requester_label=starter.get_username() if starter else (started_by or actor.name),
            actor=actor,
        )
        return GateVerdict("waiting", fresh)
