"""Which approval counts, and who may give it: the one place that decides whether a request
lets a run pass an approval state (and says why not when none does), and whether a person
is among the reviewers who may decide a request.

The commit that leaves an approval state, the worker's gate at it, a runner's next command,
the console and the API all ask ``approval_standing``; consuming the approval
(``approval_consume``) explains a refusal with the same ``request_judge``. The decision
(``approval_decide``), the review queue and the review page ask ``reviewer_refusal`` /
``reviewer_filter`` (one condition, written once) whether someone may decide; a request is
granted when ``quorum_progress`` says enough distinct reviewers approved.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from datetime import datetime
from typing import Literal
from uuid import UUID

from django.contrib.auth.models import AbstractBaseUser
from django.db.models import Q
from django.utils import timezone

from approvals.four_eyes import four_eyes_involved
from approvals.models import (
    LIVE_STATUSES,
    ApprovalRequest,
    ApprovalStatus,
    DecisionKind,
    Delegation,
)
from cairn.errors import (
    ApprovalClosed,
    ApprovalExpired,
    ApprovalHashMismatch,
    ApprovalRequired,
    ApprovalStale,
    CairnError,
)
from checkpoints.models import Run
from checkpoints.services.workflows import (
    approval_action,
    approval_escalation,
    approval_reviewers,
)
from tenants import roles
from tenants.models import ReviewerGroup, ReviewerGroupMember, Tenant
from tenants.services import permissions_of

# approved: it counts and the commit consumes it; used: it was consumed for this very run
# version and artifact (a worker gate of an earlier Cairn consumed it, then its commit failed):
# the same one use, it counts once more while the run has not moved. The rest say why not.
Verdict = Literal["approved", "used", "pending", "rejected", "expired", "none"]


@dataclass(frozen=True)
class ApprovalStanding:
    """The answer for one approval state at one run version: the request that counts, or
    the request that explains why none does (None: the run has no request at all), and the
    refusal to raise (None when it counts)."""

    verdict: Verdict
    request: ApprovalRequest | None
    refusal: CairnError | None = None

    @property
    def counts(self) -> bool:
        return self.verdict in ("approved", "used")


@dataclass(frozen=True)
class ApprovalAsk:
    """What a move past an approval state needs: an approval for ``run_id`` at ``version``,
    of ``action``, for an artifact with one of ``artifact_sha256s`` (None: any; the commit
    checks its evidence). ``place`` names the move in sentences ("Leaving 'review' for
    'publish'")."""

    run_id: UUID | str
    version: int
    action: str
    artifact_sha256s: Collection[str] | None = None
    place: str = "Leaving the approval state"


def request_judge(
    request: ApprovalRequest, ask: ApprovalAsk, now: datetime
) -> tuple[Verdict, CairnError | None]:
    """One request against what the move needs: its verdict, and the refusal unless it
    counts. Reads nothing."""
    run = ask.run_id
    if request.run_version != ask.version:
        return "none", ApprovalStale(
            f"Approval request {request.pk} is bound to run version {request.run_version}; "
            f"the run is at version {ask.version}. Ask for a new approval."
        )
    if request.action != ask.action:
        return "none", ApprovalRequired(
            f"{ask.place} needs an approval of '{ask.action}'; approval request "
            f"{request.pk} is for '{request.action}'. Ask for an approval of '{ask.action}'."
        )
    shas = ask.artifact_sha256s
    if shas is not None and request.artifact_sha256 not in shas:
        return "none", ApprovalHashMismatch(
            f"Approval request {request.pk} approves the artifact with sha256 "
            f"{request.artifact_sha256}, which the committed evidence no longer names."
        )
    lapsed = request.status in LIVE_STATUSES and request.expires_at <= now
    if request.status == ApprovalStatus.EXPIRED or lapsed:
        return "expired", ApprovalExpired(
            f"Approval request {request.pk} expired at "
            f"{request.expires_at:%Y-%m-%d %H:%M:%S} UTC; ask for a new one."
        )
    if request.status == ApprovalStatus.PENDING:
        return "pending", ApprovalRequired(
            f"{ask.place} needs a decision: approval request {request.pk} is still pending "
            f"(GET /runs/{run}/next?wait=30 answers when it is decided)."
        )
    if request.status == ApprovalStatus.REJECTED:
        return "rejected", ApprovalRequired(
            f"{ask.place} is not allowed: approval request {request.pk} was rejected "
            f"({request.status_reason or 'no reason given'}); the run can only fail."
        )
    if request.status == ApprovalStatus.APPROVED:
        return "approved", None
    if request.status == ApprovalStatus.CONSUMED:
        return "used", None
    return "none", ApprovalClosed(
        f"Approval request {request.pk} is {request.status}; it cannot be used."
    )


def approval_standing(
    *, ask: ApprovalAsk, request_id: UUID | str | None = None, now: datetime | None = None
) -> ApprovalStanding:
    """Which request lets the run pass now, and why not when none does.

    ``request_id`` (a writer's ``control.approval_request_id``) names the one to judge;
    otherwise the newest request of the run at ``ask.version`` that counts is chosen, and
    when none counts the most telling one explains why (one for the action at this version,
    else another at this version, else the run's newest). Reads one query (two when the
    run has nothing at this version); writes nothing.
    """
    now = now or timezone.now()
    named = uuid_or_none(request_id) if request_id else None
    rows = ApprovalRequest.objects.filter(run_id=ask.run_id)
    here = list(
        rows.filter(Q(run_version=ask.version) | Q(pk=named)).order_by("-created_at", "-pk")
    )
    if request_id:
        chosen = next((r for r in here if r.pk == named), None)
        if chosen is None:
            return ApprovalStanding(
                "none",
                None,
                ApprovalRequired(
                    f"{ask.place} needs an approval: approval request {request_id} does not "
                    "exist for this run."
                ),
            )
        verdict, refusal = request_judge(chosen, ask, now)
        return ApprovalStanding(verdict, chosen, refusal)
    judged = [(row, *request_judge(row, ask, now)) for row in here]
    for row, verdict, refusal in judged:
        if refusal is None:
            return ApprovalStanding(verdict, row, None)
    telling = [j for j in judged if j[0].action == ask.action] or judged
    telling.sort(key=lambda j: j[0].status == ApprovalStatus.SUPERSEDED)
    if telling:
        row, verdict, refusal = telling[0]
        return ApprovalStanding(verdict, row, refusal)
    newest = rows.order_by("-created_at", "-pk").first()
    if newest is not None:
        verdict, refusal = request_judge(newest, ask, now)
        return ApprovalStanding("none", newest, refusal)
    return ApprovalStanding(
        "none",
        None,
        ApprovalRequired(
            f"{ask.place} needs an approval of '{ask.action}': ask for one (POST "
            f"/runs/{ask.run_id}/approvals), wait for the decision (GET "
            f"/runs/{ask.run_id}/next?wait=30), then commit."
        ),
    )


def edited_shas(*, run_id: UUID | str, version: int, action: str, sha256: str) -> set[str]:
    """``sha256`` and the hashes of every edit of it (and of an edit of an edit) a reviewer
    made on a request of the run at ``version`` for ``action``: the artifacts an approval
    of the run's draft may be bound to (approve with edits). One query."""
    edits = list(
        ApprovalRequest.objects.filter(run_id=run_id, run_version=version, action=action)
        .exclude(edited_from_sha256="")
        .values_list("edited_from_sha256", "artifact_sha256")
    )
    found = {sha256}
    grew = True
    while grew:
        grew = False
        for origin, edited in edits:
            if origin in found and edited not in found:
                found.add(edited)
                grew = True
    return found


def uuid_or_none(value: object) -> UUID | None:
    try:
        return value if isinstance(value, UUID) else UUID(str(value))
    except ValueError:
        return None


# --- who may decide ------------------------------------------------------------------------
@dataclass(frozen=True)
class Reviewers:
    """Who may decide a request, as its approval state declared it: a ``role`` ("reviewer",
    "admin") or a reviewer ``group`` of the tenant, by name; neither: anyone who may review
    the run. ``quorum``: how many distinct reviewers must approve."""

    role: str = ""
    group: str = ""
    quorum: int = 1
    # The escalation levels after this one's (each {"role"|"group": …}) and how the last
    # one ends ("fail" or "hold"); none: an expired request is renewed once, as ever.
    escalation: tuple[dict[str, str], ...] = ()
    then: str = "fail"


def reviewers_declared(*, run: Run, action: str, level: int = 0) -> Reviewers:
    """What the run's workflow declares for an approval of ``action`` at escalation
    ``level`` (0: the reviewers; n: ``escalation.to[n-1]``): at the approval state the run
    is in, else at the approval state that declares ``action`` (a runner may ask before it
    moves there). Reads the run's workflow definition."""
    definition = run.workflow.definition
    gates = list(definition.get("approval_states") or ())
    states = [run.state] if run.state in gates else gates
    for state in states:
        if approval_action(definition, state) == action:
            declared, quorum = approval_reviewers(definition, state)
            escalation = approval_escalation(definition, state) or {}
            levels = tuple(escalation.get("to") or ())
            if 0 < level <= len(levels):
                declared = levels[level - 1]
            return Reviewers(
                declared.get("role", ""),
                declared.get("group", ""),
                quorum,
                levels,
                escalation.get("then", "fail"),
            )
    return Reviewers()


def _own_filter(user: AbstractBaseUser, tenant: Tenant) -> Q:
    """The requests whose declared reviewers include ``user`` in their own right: no
    declaration, a role the user holds, or a group of the tenant the user is in."""
    perms = permissions_of(user=user, tenant=tenant)
    held = [""]
    if roles.REVIEW in perms:
        held.append("reviewer")
    if roles.ADMIN in perms:
        held.append("admin")
    groups = ReviewerGroupMember.objects.filter(user=user, group__tenant=tenant)
    return Q(reviewer_role__in=held) & (
        Q(reviewer_group="") | Q(reviewer_group__in=groups.values("group__name"))
    )


def delegators_of(*, user: AbstractBaseUser, tenant: Tenant) -> list[AbstractBaseUser]:
    """Who lets ``user`` decide in their place now (active, unrevoked delegations)."""
    now = timezone.now()
    rows = Delegation.objects.filter(
        tenant=tenant, delegate=user, revoked_at__isnull=True, starts_at__lte=now, ends_at__gt=now
    ).select_related("delegator")
    return [row.delegator for row in rows.order_by("delegator__username")]


def _for(delegator: AbstractBaseUser, tenant: Tenant) -> Q:
    """What a delegate may decide for ``delegator``: what the delegator may decide, never a
    request the delegator is involved in (a delegation never approves one's own run)."""
    return _own_filter(delegator, tenant) & ~four_eyes_involved(delegator)


def reviewer_filter(*, user: AbstractBaseUser, tenant: Tenant) -> Q:
    """The requests of ``tenant`` whose declared reviewers include ``user`` (a queryset
    filter on ApprovalRequest): in their own right (no declaration, a role the user holds,
    a group of the tenant the user is in), or for someone who delegated to them now. The
    review role, the run's scope and four eyes (of the person deciding) are checked apart."""
    allowed = _own_filter(user, tenant)
    for delegator in delegators_of(user=user, tenant=tenant):
        allowed |= _for(delegator, tenant)
    return allowed


def decides_for(*, request: ApprovalRequest, user: AbstractBaseUser) -> AbstractBaseUser | None:
    """Whose vote ``user`` casts on ``request``: None for their own (they are among its
    reviewers in their own right), else the delegator whose delegation lets them decide
    it. Ask after ``reviewer_refusal`` said yes."""
    rows = ApprovalRequest.objects.filter(pk=request.pk)
    if rows.filter(_own_filter(user, request.tenant)).exists():
        return None
    for delegator in delegators_of(user=user, tenant=request.tenant):
        if rows.filter(_for(delegator, request.tenant)).exists():
            return delegator
    return None


def _label(role: str, group: str) -> str:
    if group:
        return f"the reviewer group '{group}'"
    if role:
        return f"members with the {role} role"
    return "anyone who may review the run"


def reviewers_label(request: ApprovalRequest | Reviewers) -> str:
    """Who decides ``request`` (or a declaration), as a sentence fragment ("the reviewer
    group 'legal'")."""
    if isinstance(request, Reviewers):
        return _label(request.role, request.group)
    return _label(request.reviewer_role, request.reviewer_group)


def reviewer_refusal(*, request: ApprovalRequest, user: AbstractBaseUser) -> str:
    """The sentence refusing ``user`` a decision on ``request`` because they are not among
    its declared reviewers, or "" when they are. One or two queries."""
    tenant = request.tenant
    rows = ApprovalRequest.objects.filter(pk=request.pk)
    if rows.filter(reviewer_filter(user=user, tenant=tenant)).exists():
        return ""
    who = reviewers_label(request)
    if request.reviewer_group and not (
        ReviewerGroup.objects.filter(tenant=tenant, name=request.reviewer_group).exists()
    ):
        return (
            f"Only {who} decides this request, and {tenant.slug} has no such group: an admin "
            "creates it and adds its members on the reviewer groups page"
        )
    if request.reviewer_group:
        return f"Only {who} decides this request, and you are not in it"
    return f"Only {who} decide this request"


@dataclass(frozen=True)
class QuorumProgress:
    """How far a request is from its quorum: the approvals so far (reviewer, time), by
    distinct reviewers (one decision each), and how many are required. Reads as
    "1 of 2; rita approved at 2026-12-04 22:50:01 UTC"."""

    required: int
    approvals: tuple[tuple[str, datetime], ...]

    @property
    def approved(self) -> int:
        return len(self.approvals)

    @property
    def reached(self) -> bool:
        return self.approved >= self.required

    def __str__(self) -> str:
        head = f"{self.approved} of {self.required}"
        said = [f"{name} approved at {at:%Y-%m-%d %H:%M:%S} UTC" for name, at in self.approvals]
        return "; ".join([head, *said])


def quorum_progress(request: ApprovalRequest) -> QuorumProgress:
    """The request's approvals against its quorum (uses prefetched decisions when there)."""
    approvals = sorted(
        (d for d in request.decisions.all() if d.decision == DecisionKind.APPROVE),
        key=lambda d: d.created_at,
    )
    # One vote per reviewer: a decision through a delegation is the delegator's vote.
    votes: dict[object, tuple[str, datetime]] = {}
    for d in approvals:
        voter = d.on_behalf_of_id or d.approver_id
        name = d.approver.get_username()
        if d.on_behalf_of_id:
            name = f"{name} (for {d.on_behalf_of.get_username()})"
        votes.setdefault(voter, (name, d.created_at))
    return QuorumProgress(request.required_approvals, tuple(votes.values()))
