"""Deciding: one reviewer, one final approve or reject of exactly the artifact shown, or an
approval of their own edit of it (approve with edits)."""

from __future__ import annotations

from datetime import datetime
from uuid import UUID

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.db import IntegrityError, transaction
from django.db.models import Q
from django.utils import timezone

from approvals import signals
from approvals.four_eyes import four_eyes_refusal
from approvals.models import (
    LIVE_STATUSES,
    ApprovalDecision,
    ApprovalRequest,
    ApprovalStatus,
    DecisionKind,
)
from approvals.services._common import (
    MAX_COMMENT,
    RUN_OPEN_STATUSES,
    default_expiry,
    lock_run,
    may_review,
    request_insert,
    run_fail_at_approval,
    send_after_commit,
)
from approvals.services.expiry import expire_request
from approvals.services.standing import (
    decides_for,
    quorum_progress,
    reviewer_refusal,
    uuid_or_none,
)
from cairn.credentials import free_text_refuse
from cairn.errors import (
    AlreadyDecided,
    ApprovalClosed,
    ApprovalExpired,
    ApprovalHashMismatch,
    ApprovalStale,
    CairnError,
    InvalidRequest,
    NotFound,
    PayloadTooLarge,
    ReviewNotAllowed,
    SelfApprovalForbidden,
)
from checkpoints.models import Execution, Run
from checkpoints.services.artifacts import artifact_content, artifact_store
from checkpoints.services.changes import run_changed
from checkpoints.services.outbox import outbox_enqueue
from tenants.models import Tenant
from tenants.selectors import review_scope
from tenants.services import Actor, audit_record


def _refused(request: ApprovalRequest, actor: Actor, error: CairnError, decision: str) -> None:
    with transaction.atomic():
        audit_record(
            tenant=request.tenant,
            actor=actor,
            action="approval.decision_refused",
            run_id=request.run_id,
            target=str(request.pk),
            reason=error.detail,
            details={"code": error.code, "decision": decision},
        )


def approval_decide(
    *,
    tenant: Tenant,
    request_id: UUID | str,
    decision: str,
    artifact_sha256: str,
    actor: Actor,
    comment: str = "",
    edited_text: str | None = None,
) -> ApprovalDecision:
    """Record one reviewer's approve or reject of exactly the artifact they were shown.

    ``edited_text`` (approve only): approve with edits. The reviewer's edit of the text
    artifact they were shown (``artifact_sha256``) is stored as a new artifact (the
    original's kind and media type, uploaded by the reviewer), and in the same transaction
    the request is superseded (its reason names the editor and the new request) by a new
    one bound to the edited artifact's sha256, for the same run version, action, reviewers,
    requester and quorum, whose first approval is the editor's (the returned decision is on
    it: ``decision.request``). Approvals of the old hash do not carry over: a quorum starts
    again. Audited as ``approval.edited``. Refused besides: InvalidRequest (a reject with an
    edit, an edit that changes nothing, an artifact that is not UTF-8 text), PayloadTooLarge
    (CAIRN_MAX_ARTIFACT_BYTES), SecretInEnvelope (a credential in the text).

    Atomic: the decision, the request's new status, the audit event and the run's next
    command are written together. An approval that completes the request enqueues the run's
    resume through the outbox (expected version = the bound version). A reject of a worker
    run enqueues its resume too, and the workflow's approval gate moves it where the workflow
    says (default: failed, with the comment as reason); an externally driven run is failed
    right here, with the comment as reason.

    Checked in this order; each refusal is audited and leaves the request as it was, except
    that an expired request is marked expired (and a fresh one raised): InvalidRequest (no
    user, bad decision), ReviewNotAllowed (no review role), NotFound (another tenant's
    request too), ApprovalExpired, ApprovalHashMismatch (409), ApprovalStale (the run moved
    past the bound version, or a newer request replaced this one), ReviewNotAllowed (403:
    not among the reviewers the approval state declares, ``reviewer_refusal``),
    SelfApprovalForbidden
    (four eyes: the reviewer started the run, raised the request, or uploaded or committed
    the artifact under review; ``approvals.four_eyes``), AlreadyDecided, ApprovalClosed
    (decided by others or used).
    """
    if decision not in DecisionKind.values:
        raise InvalidRequest(
            "decision must be 'approve' or 'reject'.", fields={"decision": "approve or reject"}
        )
    comment = (comment or "").strip()
    if decision == DecisionKind.REJECT and not comment:
        raise InvalidRequest(
            "Give a reason for the rejection: it is recorded with the decision and becomes the "
            "run's reason. Nothing was decided.",
            fields={"comment": "required for a rejection"},
        )
    free_text_refuse({"comment": comment})
    if edited_text is not None:
        _edit_check(decision, edited_text)
    if len(comment) > MAX_COMMENT:
        raise InvalidRequest(
            f"The comment is longer than {MAX_COMMENT} characters.", fields={"comment": "too long"}
        )
    user = actor.user
    if user is None or not user.is_authenticated:
        raise InvalidRequest("Only a signed-in reviewer can decide.")
    if not may_review(user=user, tenant=tenant):
        raise ReviewNotAllowed("Your role in this tenant does not allow deciding approvals.")
    try:
        return _decide(
            tenant=tenant,
            request_id=request_id,
            decision=decision,
            artifact_sha256=artifact_sha256,
            actor=actor,
            comment=comment,
            edited_text=edited_text,
        )
    except _Refusal as refusal:
        _refused(refusal.request, actor, refusal.error, decision)
        raise refusal.error


class _Refusal(Exception):
    def __init__(self, request: ApprovalRequest, error: CairnError):
        self.request, self.error = request, error


def _decide(
    *,
    tenant: Tenant,
    request_id: UUID | str,
    decision: str,
    artifact_sha256: str,
    actor: Actor,
    comment: str,
    edited_text: str | None = None,
) -> ApprovalDecision:
    user = actor.user
    expired: ApprovalRequest | None = None
    with transaction.atomic():
        if edited_text is not None:
            # An edit raises a request: the run's row first, as every raise does.
            _lock_run_of(tenant=tenant, request_id=request_id)
        request = _lock_request(tenant=tenant, request_id=request_id)
        if not review_scope(user=user, tenant=tenant).allows(request.run_id):
            # A holder of run grants does not learn that other runs' requests exist.
            raise NotFound("No such approval request.")
        now = timezone.now()
        if request.status == ApprovalStatus.EXPIRED or (
            request.status in LIVE_STATUSES and request.expires_at <= now
        ):
            expire_request(request=request, actor=Actor.system("approval-expiry"))
            expired = request
        else:
            voter = _check_decidable(request=request, user=user, artifact_sha256=artifact_sha256)
            if edited_text is not None:
                request = _edit(request=request, text=edited_text, actor=actor)
            row = _decision_insert(
                request=request,
                user=user,
                decision=decision,
                sha=request.artifact_sha256,
                comment=comment,
                on_behalf_of=voter,
            )
            _apply(request=request, decision=row, actor=actor)
            if request.run.execution == Execution.EXTERNAL:
                run_changed(run_id=request.run_id)  # its runner may be long-polling
            send_after_commit(signals.approval_decided, request=request, decision=row)
            return row
    # Outside the block so the expiry (and its fresh request) is committed, not rolled back.
    raise _Refusal(
        expired,
        ApprovalExpired(
            f"This approval request expired at {expired.expires_at:%Y-%m-%d %H:%M:%S} UTC; "
            "nothing was decided. A fresh request is raised (once) while the run still waits."
        ),
    )


def _edit_check(decision: str, text: object) -> None:
    """What an edit must be before anything is locked: part of an approval, text, within
    the artifact size limit, no credential in it."""
    if decision != DecisionKind.APPROVE:
        raise InvalidRequest(
            "Only an approval carries an edit: approve your edited text, or reject without "
            "one. Nothing was decided.",
            fields={"edited_text": "only with decision 'approve'"},
        )
    if not isinstance(text, str):
        raise InvalidRequest("The edited text is not text.", fields={"edited_text": "text"})
    if not text.strip():
        raise InvalidRequest(
            "The edited text is empty; reject the artifact instead. Nothing was decided.",
            fields={"edited_text": "empty"},
        )
    size = len(text.encode("utf-8", errors="surrogatepass"))
    if size > settings.CAIRN_MAX_ARTIFACT_BYTES:
        raise PayloadTooLarge(
            f"The edited text is {size} bytes; an artifact may have at most "
            f"{settings.CAIRN_MAX_ARTIFACT_BYTES} (CAIRN_MAX_ARTIFACT_BYTES). Nothing was "
            "decided.",
            fields={"edited_text": "too large"},
        )
    free_text_refuse({"edited_text": text}, hint="in the edited text")


def _lock_run_of(*, tenant: Tenant, request_id: UUID | str) -> None:
    run_id = (
        ApprovalRequest.objects.filter(tenant=tenant, pk=uuid_or_none(request_id))
        .values_list("run_id", flat=True)
        .first()
    )
    if run_id is None:
        raise NotFound("No such approval request.")
    lock_run(tenant=tenant, run_id=run_id)


def _edit(*, request: ApprovalRequest, text: str, actor: Actor) -> ApprovalRequest:
    """Store the edit, supersede ``request`` and raise its successor bound to the edited
    bytes (the caller records the editor's approval on it). Inside the decision's
    transaction, the run locked; refusals are ``_Refusal``."""
    user = actor.user
    original = request.artifact
    data = text.encode("utf-8", errors="surrogatepass")
    try:
        shown = artifact_content(original).decode("utf-8")
    except UnicodeDecodeError:
        raise _Refusal(
            request,
            InvalidRequest(
                "The artifact under review is not UTF-8 text, so it cannot be edited here; "
                "approve or reject it. Nothing was decided.",
                fields={"edited_text": "the artifact is not text"},
            ),
        )
    if data == shown.encode("utf-8"):
        raise _Refusal(
            request,
            InvalidRequest(
                "The edit changes nothing: the text is the artifact under review, byte for "
                "byte. Approve without an edit instead. Nothing was decided.",
                fields={"edited_text": "identical to the artifact under review"},
            ),
        )
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        raise _Refusal(
            request,
            InvalidRequest("The edited text is not valid UTF-8.", fields={"edited_text": "text"}),
        )
    edited, _ = artifact_store(
        tenant=request.tenant,
        data=data,
        media_type=original.media_type,
        kind=original.kind,
        uploaded_by=user,
    )
    run = request.run
    now = timezone.now()
    successor = request_insert(
        run=run,
        artifact=edited,
        action=request.action,
        expires_at=max(request.expires_at, default_expiry(now)),
        required_approvals=request.required_approvals,
        requester=request.requester,
        requester_label=request.requester_label,
        actor=actor,
        escalation_level=request.escalation_level,
        reason=request.status_reason if request.escalation_level else "",
        edited_from=original,
        edited_by=user,
    )
    why = (
        f"Edited by {user.get_username()}: replaced by request {successor.pk} for the edited "
        f"artifact {edited.sha256[:12]}; approvals of {original.sha256[:12]} do not carry over."
    )
    ApprovalRequest.objects.filter(pk=request.pk).update(status_reason=why)
    audit_record(
        tenant=request.tenant,
        actor=actor,
        action="approval.edited",
        run_id=run.id,
        target=str(successor.pk),
        details={
            "superseded_request_id": str(request.pk),
            "request_id": str(successor.pk),
            "from_artifact_id": str(original.pk),
            "from_sha256": original.sha256,
            "to_artifact_id": str(edited.pk),
            "to_sha256": edited.sha256,
            "size": edited.size,
        },
    )
    successor.run = run
    return successor


def _lock_request(*, tenant: Tenant, request_id: UUID | str) -> ApprovalRequest:
    try:
        return (
            ApprovalRequest.objects.select_for_update(of=("self",))
            .select_related("run", "tenant", "artifact", "requester")
            .get(tenant=tenant, pk=request_id)
        )
    except (ApprovalRequest.DoesNotExist, ValueError):
        raise NotFound("No such approval request.")


def _check_decidable(
    *, request: ApprovalRequest, user: AbstractBaseUser, artifact_sha256: str
) -> AbstractBaseUser | None:
    """Refuse (``_Refusal``) or return whose vote the decision is: None for the user's
    own, else the delegator they decide for (``decides_for``)."""
    run = request.run
    if artifact_sha256 != request.artifact_sha256:
        raise _Refusal(
            request,
            ApprovalHashMismatch(
                f"The artifact you were shown ({(artifact_sha256 or 'none')[:12]}…) is not the "
                f"one under review ({request.artifact_sha256[:12]}…); nothing was decided. "
                "Reload the request and review the current artifact.",
                fields={"artifact_sha256": "is not the bound artifact's sha256"},
            ),
        )
    if request.status == ApprovalStatus.SUPERSEDED:
        raise _Refusal(
            request,
            # The run asked again (a retried step, a restore), often for the very same draft:
            # say what replaced it rather than guessing that the draft changed.
            ApprovalStale(
                "A newer approval request replaced this one"
                + (f" ({request.status_reason.rstrip('.')})" if request.status_reason else "")
                + "; nothing was decided. Review the new request."
            ),
        )
    if run.version != request.run_version or run.status not in RUN_OPEN_STATUSES:
        raise _Refusal(
            request,
            ApprovalStale(
                f"The run moved on since this request (version {request.run_version} → "
                f"{run.version}, now {run.status}); nothing was decided."
            ),
        )
    not_theirs = reviewer_refusal(request=request, user=user)
    if not_theirs:
        raise _Refusal(request, ReviewNotAllowed(f"{not_theirs}; nothing was decided."))
    involved = four_eyes_refusal(request=request, user=user)
    if involved:
        raise _Refusal(request, SelfApprovalForbidden(f"{involved}; nothing was decided."))
    if request.decisions.filter(Q(approver=user) | Q(on_behalf_of=user)).exists():
        raise _Refusal(
            request,
            AlreadyDecided(
                "You already decided this request (or someone decided it for you through "
                "your delegation); decisions are final. Nothing was changed."
            ),
        )
    voter = decides_for(request=request, user=user)
    if voter is not None and (
        request.decisions.filter(Q(approver=voter) | Q(on_behalf_of=voter)).exists()
    ):
        raise _Refusal(
            request,
            AlreadyDecided(
                f"{voter.get_username()}'s vote on this request is already in; you decide "
                "it only for them. Nothing was changed."
            ),
        )
    if request.status != ApprovalStatus.PENDING:
        raise _Refusal(
            request,
            ApprovalClosed(f"This request is already {request.status}; nothing was decided."),
        )
    return voter


def _decision_insert(
    *,
    request: ApprovalRequest,
    user: AbstractBaseUser,
    decision: str,
    sha: str,
    comment: str,
    on_behalf_of: AbstractBaseUser | None = None,
) -> ApprovalDecision:
    try:
        with transaction.atomic():
            return ApprovalDecision.objects.create(
                tenant_id=request.tenant_id,
                request=request,
                approver=user,
                on_behalf_of=on_behalf_of,
                decision=decision,
                artifact_sha256=sha,
                comment=comment,
            )
    except IntegrityError:
        # A second tab of the same reviewer won the race.
        raise _Refusal(
            request,
            AlreadyDecided(
                "You already decided this request; decisions are final. Nothing was changed."
            ),
        )


def _apply(*, request: ApprovalRequest, decision: ApprovalDecision, actor: Actor) -> None:
    """Move the request (and, when it is settled, the run) after one decision."""
    run = request.run
    now = timezone.now()
    audit_record(
        tenant=request.tenant,
        actor=actor,
        action="approval.decision",
        run_id=run.id,
        target=str(request.pk),
        reason=decision.comment,
        details={
            "decision": decision.decision,
            "on_behalf_of": (
                decision.on_behalf_of.get_username() if decision.on_behalf_of_id else None
            ),
            "artifact_sha256": decision.artifact_sha256,
            "action": request.action,
            "run_version": request.run_version,
        },
    )
    if decision.decision == DecisionKind.REJECT:
        reason = decision.comment or f"Rejected by {actor.name}."
        _settle(request, ApprovalStatus.REJECTED, now, reason)
        if run.execution == Execution.WORKER:
            # The workflow code says where a rejection leads; the worker's approval gate
            # reads this rejection and moves the run there (default: failed, this reason).
            _enqueue_resume(run)
        else:
            run_fail_at_approval(
                request=request,
                run=request.run,
                actor=actor,
                reason=reason,
                status_reason=f"Approval of '{request.action}' rejected: {reason}",
            )
        return
    if not quorum_progress(request).reached:
        return  # still pending: more distinct reviewers must approve
    _settle(request, ApprovalStatus.APPROVED, now, "")
    if run.execution == Execution.WORKER:
        _enqueue_resume(run)
    else:
        # The runner ships the approved artifact: an edit's, when a reviewer edited it.
        outbox_enqueue(
            run=run,
            kind="approval.decided",
            payload={
                "request_id": str(request.pk),
                "status": request.status,
                "artifact_id": str(request.artifact_id),
                "artifact_sha256": request.artifact_sha256,
                "edited_from_sha256": request.edited_from_sha256 or None,
            },
        )


def _enqueue_resume(run: Run) -> None:
    """The run's next command, in the decision's transaction; a stale one is a no-op."""
    outbox_enqueue(
        run=run,
        kind="run.resume",
        payload={"run_id": str(run.id), "expected_version": run.version},
    )


def _settle(request: ApprovalRequest, status: str, now: datetime, reason: str) -> None:
    ApprovalRequest.objects.filter(pk=request.pk).update(
        status=status, decided_at=now, status_reason=reason
    )
    request.status, request.decided_at, request.status_reason = status, now, reason
