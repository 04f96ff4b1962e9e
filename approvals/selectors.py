"""Reads shared by the API, the reviewer pages and the console, tenant filter built in."""

from __future__ import annotations

from uuid import UUID

from django.contrib.auth.models import AbstractBaseUser
from django.db.models import Exists, OuterRef, QuerySet
from django.utils import timezone

from approvals.models import ApprovalDecision, ApprovalRequest, ApprovalStatus
from checkpoints.errors import NotFound
from checkpoints.models import Run
from tenants import roles
from tenants.models import Tenant
from tenants.services import permissions_of


def requests_for_tenant(tenant: Tenant, *, status: str | None = None) -> QuerySet:
    rows = ApprovalRequest.objects.filter(tenant=tenant).select_related("run", "artifact")
    return rows.filter(status=status) if status else rows


def review_queue(*, tenant: Tenant, user: AbstractBaseUser) -> QuerySet:
    """Pending, unexpired requests ``user`` may decide, most urgent first.

    Empty for a user without the review role. Leaves out the user's own requests and those
    the user has already decided (a request needing several approvals stays pending).
    Per-run reviewer grants, when they come, narrow this queryset further.
    """
    if roles.REVIEW not in permissions_of(user=user, tenant=tenant):
        return ApprovalRequest.objects.none()
    decided = ApprovalDecision.objects.filter(request=OuterRef("pk"), approver=user)
    return (
        requests_for_tenant(tenant, status=ApprovalStatus.PENDING)
        .filter(expires_at__gt=timezone.now())
        .exclude(requester=user)
        .exclude(Exists(decided))
        .order_by("expires_at", "id")
    )


def request_get(*, tenant: Tenant, request_id: UUID | str) -> ApprovalRequest:
    """The tenant's request, or NotFound (another tenant's request is not disclosed)."""
    try:
        return (
            ApprovalRequest.objects.select_related("run", "artifact", "requester", "checkpoint")
            .prefetch_related("decisions__approver")
            .get(tenant=tenant, pk=request_id)
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
