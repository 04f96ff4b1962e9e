"""Using an approval (restore step 6, and the commit that leaves an approval state): consumed
once, for the bound version, action, hash."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from approvals.models import LIVE_STATUSES, ApprovalRequest, ApprovalStatus
from approvals.services._common import lock_run, request_insert, run_starter, uuid_or_none
from approvals.services.expiry import expire_request
from cairn.errors import (
    ApprovalClosed,
    ApprovalExpired,
    ApprovalHashMismatch,
    ApprovalRequired,
    ApprovalStale,
    ArtifactHashMismatch,
    CairnError,
    NotFound,
)
from checkpoints.approvals_port import ApprovalUse, CommitRun
from checkpoints.models import Artifact, Checkpoint, Run
from tenants.services import Actor, audit_record


def approval_commit_check(
    *, run: CommitRun, state: str, evidence: dict[str, Any], control: dict[str, Any]
) -> ApprovalUse | None:
    """The approval that lets a commit leave the approval state ``run.state`` for ``state``
    (``run`` as the commit read it): the request ``control.approval_request_id`` names,
    else the run's latest for its version (else its latest at all), bound to ``run.version``
    for an artifact ``evidence`` still names, approved and unexpired. Reads only.

    Returns the request the commit must consume in its transaction (``approval_consume``),
    or None when the gate consumed it for this same version (the same one use). Raises
    ApprovalRequired (none, pending or rejected), ApprovalStale, ApprovalHashMismatch or
    ApprovalExpired.
    """
    named = control.get("approval_request_id")
    requests = ApprovalRequest.objects.filter(run_id=run.id)
    request = (
        requests.filter(pk=uuid_or_none(named)).first()
        if named
        else (
            requests.filter(run_version=run.version)
            .exclude(status=ApprovalStatus.SUPERSEDED)
            .order_by("-created_at", "-pk")
            .first()
            or requests.order_by("-created_at", "-pk").first()
        )
    )
    leaving = f"Leaving the approval state '{run.state}' for '{state}'"
    if request is None:
        raise ApprovalRequired(
            f"{leaving} needs an approval: ask for one (POST /runs/{run.id}/approvals), wait "
            f"for the decision (GET /runs/{run.id}/next?wait=30), then commit."
        )
    if request.run_version != run.version:
        raise ApprovalStale(
            f"Approval request {request.pk} is bound to run version {request.run_version}; "
            f"the run is at version {run.version}. Ask for a new approval."
        )
    shas = {ref.get("sha256") for ref in evidence.get("artifacts") or []}
    if request.artifact_sha256 not in shas:
        raise ApprovalHashMismatch(
            f"Approval request {request.pk} approves the artifact with sha256 "
            f"{request.artifact_sha256}, which the committed evidence no longer names."
        )
    if request.status == ApprovalStatus.PENDING:
        raise ApprovalRequired(
            f"{leaving} needs a decision: approval request {request.pk} is still pending "
            f"(GET /runs/{run.id}/next?wait=30 answers when it is decided)."
        )
    if request.status == ApprovalStatus.REJECTED:
        raise ApprovalRequired(
            f"{leaving} is not allowed: approval request {request.pk} was rejected "
            f"({request.status_reason or 'no reason given'}); the run can only fail."
        )
    if request.status == ApprovalStatus.EXPIRED:
        raise ApprovalExpired(f"Approval request {request.pk} expired; ask for a new one.")
    if request.status == ApprovalStatus.CONSUMED:
        return None  # used for this very version by the gate: the same one use
    # Approved (or closed some other way): consumed by the commit, or refused with its code.
    return ApprovalUse(request.pk, request.action, request.artifact_sha256)


def approval_consume(
    *, run: Run, request_id: UUID | str, action: str, artifact_sha256: str, actor: Actor
) -> ApprovalRequest:
    """Use an approved request to let the run continue: exactly once, and only for the run's
    current version, the action and the artifact sha256 it names, before its expiry.

    One conditional UPDATE (approved → consumed); call it inside the transaction that moves
    the run past its approval state, so the approval is used if and only if the run moves.
    Raises NotFound, ApprovalExpired (and marks the request expired), ApprovalStale,
    ApprovalHashMismatch or ApprovalClosed (not approved, or already consumed).
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
        error = _unusable(request=request, run=run, action=action, sha=artifact_sha256, now=now)
        if isinstance(error, ApprovalExpired):
            expire_request(request=request, actor=actor, renew=False)
    raise error  # after the block, so an expiry found here stays recorded


def _unusable(
    *, request: ApprovalRequest, run: Run, action: str, sha: str, now: datetime
) -> CairnError:
    if request.status == ApprovalStatus.EXPIRED or (
        request.status in LIVE_STATUSES and request.expires_at <= now
    ):
        return ApprovalExpired(
            f"The approval expired at {request.expires_at:%Y-%m-%d %H:%M:%S} UTC."
        )
    if request.artifact_sha256 != sha:
        return ApprovalHashMismatch(
            f"The approval is for artifact {request.artifact_sha256[:12]}…, "
            f"not {sha[:12]}…: the draft changed after the request."
        )
    if request.run_version != run.version or request.action != action:
        return ApprovalStale(
            f"The approval is for '{request.action}' at run version {request.run_version}; "
            f"the run is at version {run.version} asking for '{action}'."
        )
    return ApprovalClosed(f"The approval is {request.status}; it cannot be used.")


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

    Continues only with an approved, unexpired request bound to the run's current version,
    ``action`` and the current artifact's sha256, which it consumes (once). A live request
    for another artifact or version (a regenerated draft, a retried step) is superseded
    and a new one raised; an expired one is marked expired and, unless the workflow names
    an ``on_expiry`` state (outcome "expired"), replaced by a fresh request. A reject bound
    to this version and artifact answers "rejected". With no request yet, one is raised,
    attributed to the member who started the run.

    Atomic (joins the caller's transaction): call it in the transaction that moves the run
    past the approval state, so the approval is consumed if and only if the run moves.
    Raises NotFound or ArtifactHashMismatch (the artifact is not stored with that sha256).
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
        live = (
            ApprovalRequest.objects.select_related("tenant", "artifact", "requester")
            .filter(run=run, action=action, status__in=LIVE_STATUSES)
            .first()
        )
        if live is not None and live.expires_at <= now:
            expire_request(request=live, actor=actor, renew=False)
            if on_expiry:
                return GateVerdict(
                    "expired", live, f"The approval request expired at {live.expires_at}."
                )
            live = None
        if (
            live is not None
            and live.artifact_sha256 == artifact_sha256
            and live.run_version == run.version
        ):
            if live.status == ApprovalStatus.PENDING:
                return GateVerdict("waiting", live)
            consumed = approval_consume(
                run=run,
                request_id=live.pk,
                action=action,
                artifact_sha256=artifact_sha256,
                actor=actor,
            )
            return GateVerdict("approved", consumed)
        if live is None:
            last = (
                ApprovalRequest.objects.filter(run=run, action=action)
                .order_by("-created_at", "-pk")
                .first()
            )
            bound_here = (
                last is not None
                and last.run_version == run.version
                and last.artifact_sha256 == artifact_sha256
            )
            if bound_here and last.status == ApprovalStatus.REJECTED:
                return GateVerdict("rejected", last, last.status_reason)
            if bound_here and last.status == ApprovalStatus.CONSUMED:
                # Consumed, yet the run is still at the bound version: the commit that was to
                # move it on failed (a lost lease, a crash). This is still that one use; once
                # the run moves, the version no longer matches and it can never count again.
                audit_record(
                    tenant=run.tenant,
                    actor=actor,
                    action="approval.consume_resumed",
                    run_id=run.id,
                    target=str(last.pk),
                    details={"run_version": run.version, "artifact_sha256": artifact_sha256},
                )
                return GateVerdict("approved", last)
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
