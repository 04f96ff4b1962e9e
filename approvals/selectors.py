"""Reads shared by the API, the reviewer pages and the console, tenant filter built in."""

from __future__ import annotations

from uuid import UUID

from django.contrib.auth.models import AbstractBaseUser
from django.db.models import Exists, F, OuterRef, Q, QuerySet
from django.utils import timezone

from approvals.four_eyes import four_eyes_involved
from approvals.models import ApprovalDecision, ApprovalRequest, ApprovalStatus
from approvals.services.standing import (
    ApprovalAsk,
    ApprovalStanding,
    approval_standing,
    reviewer_filter,
)
from cairn.errors import NotFound
from checkpoints.models import (
    ACTIVE_STATUSES,
    Artifact,
    ArtifactKind,
    ArtifactReference,
    Run,
    RunStatus,
)
from checkpoints.services.workflows import approval_action
from tenants.models import Tenant
from tenants.selectors import review_scope

OPEN_RUN_STATUSES = sorted(ACTIVE_STATUSES - {RunStatus.CANCELLING})


def requests_for_tenant(
    tenant: Tenant, *, status: str | None = None, user: AbstractBaseUser | None = None
) -> QuerySet:
    """The tenant's requests; with ``user``, only those of runs the user may review (every
    run for a reviewer, the granted runs for a holder of run grants, none otherwise)."""
    rows = ApprovalRequest.objects.filter(tenant=tenant).select_related("run", "artifact")
    if user is not None:
        rows = review_scope(user=user, tenant=tenant).apply(rows)
    return rows.filter(status=status) if status else rows


def review_queue(*, tenant: Tenant, user: AbstractBaseUser) -> QuerySet:
    """Pending, unexpired requests ``user`` may decide, most urgent first.

    Empty for a user without the review role; only the granted runs for a holder of run
    grants. Leaves out the requests the user may not decide by the four-eyes rule (they
    started the run, asked, or uploaded or committed the artifact) and those the user has
    already decided (a request needing several approvals stays pending), and those whose
    approval state declares reviewers the user is not among (``reviewer_filter``). A
    request whose
    run moved past the bound version, or ended, is left out too: deciding it would only be
    refused as stale.
    """
    decided = ApprovalDecision.objects.filter(request=OuterRef("pk")).filter(
        Q(approver=user) | Q(on_behalf_of=user)
    )
    return (
        requests_for_tenant(tenant, status=ApprovalStatus.PENDING, user=user)
        .filter(expires_at__gt=timezone.now())
        .filter(run__version=F("run_version"), run__status__in=OPEN_RUN_STATUSES)
        .filter(reviewer_filter(user=user, tenant=tenant))
        .exclude(four_eyes_involved(user))
        .exclude(Exists(decided))
        .order_by("expires_at", "id")
    )


def request_get(
    *, tenant: Tenant, request_id: UUID | str, user: AbstractBaseUser | None = None
) -> ApprovalRequest:
    """The tenant's request, or NotFound (another tenant's request is not disclosed). With
    ``user``, a request of a run outside the user's review scope is NotFound too."""
    rows = ApprovalRequest.objects.filter(tenant=tenant)
    if user is not None:
        rows = review_scope(user=user, tenant=tenant).apply(rows)
    try:
        return (
            rows.select_related("run", "artifact", "requester", "checkpoint", "edited_by")
            .prefetch_related("decisions__approver")
            .get(pk=request_id)
        )
    except (ApprovalRequest.DoesNotExist, ValueError):
        raise NotFound("No such approval request.")


def previous_request(request: ApprovalRequest) -> ApprovalRequest | None:
    """The request made for the same run just before this one (what the reviewer diffs)."""
    return (
        ApprovalRequest.objects.filter(run_id=request.run_id, created_at__lte=request.created_at)
        .exclude(pk=request.pk)
        .select_related("artifact")
        .order_by("-created_at", "-id")
        .first()
    )


def approvals_for_run(*, tenant: Tenant, run: Run) -> QuerySet:
    """A run's requests, newest first, with their decisions (the console's run page)."""
    return (
        ApprovalRequest.objects.filter(tenant=tenant, run=run)
        .select_related("artifact", "requester")
        .prefetch_related("decisions__approver")
        .order_by("-created_at", "-id")
    )


def decisions_of(*, tenant: Tenant, user: AbstractBaseUser) -> QuerySet:
    """The user's own decisions in the tenant, newest first, with their requests and runs."""
    return (
        ApprovalDecision.objects.filter(tenant=tenant, approver=user)
        .select_related("request", "request__run")
        .order_by("-created_at", "-id")
    )


def approval_standing_for_run(*, run: Run, evidence: dict) -> ApprovalStanding | None:
    """At an approval state, what ``approval_standing`` says of the run as it is (its
    version, the action its approval state declares, the artifacts ``evidence`` names):
    the request that lets it pass, or why none does. None at any other state. For the run
    page; reads one query."""
    definition = run.workflow.definition
    if run.state not in (definition.get("approval_states") or ()):
        return None
    ask = ApprovalAsk(
        run_id=run.pk,
        version=run.version,
        action=approval_action(definition, run.state),
        artifact_sha256s={ref.get("sha256") for ref in evidence.get("artifacts") or []},
        place=f"Leaving '{run.state}'",
    )
    return approval_standing(ask=ask)


# What counts as decided: a decision only the run's command has to carry out.
DECIDED_STATUSES = (ApprovalStatus.APPROVED, ApprovalStatus.REJECTED, ApprovalStatus.CONSUMED)


def runs_with_unused_decision(runs: QuerySet) -> QuerySet:
    """``runs`` narrowed to those with a request bound to their current version that was
    decided (approved, rejected) or consumed for this version by an older gate whose commit
    never came: at their approval state such a run waits for nothing but its command. A
    filter (``Exists``) for the rescue's sweep; which request counts is still
    ``approval_standing``'s to say when the command runs."""
    decided = ApprovalRequest.objects.filter(
        run=OuterRef("pk"), run_version=OuterRef("version"), status__in=DECIDED_STATUSES
    )
    return runs.filter(Exists(decided))


def cited_sources(request: ApprovalRequest) -> list[Artifact]:
    """The source artifacts the checkpoint under review holds as evidence (the sources a
    draft cites), oldest first: what a reviewer may open from the review page. Reads only
    the reference index (envelopes stay sealed)."""
    references = ArtifactReference.objects.filter(
        tenant_id=request.tenant_id,
        checkpoint__run_id=request.run_id,
        checkpoint__sequence=request.checkpoint_sequence,
        artifact__kind=ArtifactKind.SOURCE,
    ).values("artifact_id")
    return list(
        Artifact.objects.filter(tenant_id=request.tenant_id, pk__in=references).order_by(
            "created_at", "pk"
        )
    )
