"""Delegation: a reviewer lets another reviewer of the tenant decide in their place for a
period (a holiday). What the delegate may then decide is ``reviewer_filter``'s to say
(``approvals.services.standing``): what the delegator may decide, never a request the
delegator is involved in; a decision made so is the delegator's one vote."""

from __future__ import annotations

from datetime import datetime, timedelta
from uuid import UUID

from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction
from django.db.models import Q, QuerySet
from django.utils import timezone

from approvals.models import Delegation
from approvals.services._common import MAX_COMMENT, may_review
from cairn.credentials import free_text_refuse
from cairn.errors import InvalidRequest, NotFound, ReviewNotAllowed
from tenants.models import Tenant
from tenants.services import Actor, audit_record
from tenants.usernames import account_find

MAX_DELEGATION = timedelta(days=90)


def delegation_create(
    *,
    tenant: Tenant,
    delegate_username: str,
    ends_at: datetime,
    actor: Actor,
    starts_at: datetime | None = None,
    reason: str = "",
) -> Delegation:
    """The acting reviewer delegates to ``delegate_username`` from ``starts_at`` (now)
    until ``ends_at`` (at most 90 days on). Both must be able to review in the tenant.
    Raises ReviewNotAllowed (the actor cannot review) or InvalidRequest (with ``fields``).
    Audited as ``delegation.created``."""
    user = actor.user
    if user is None or not may_review(user=user, tenant=tenant):
        raise ReviewNotAllowed("Only a reviewer of this tenant can delegate their reviews.")
    reason = (reason or "").strip()
    free_text_refuse({"reason": reason})
    now = timezone.now()
    starts_at = starts_at or now
    problems: dict[str, str] = {}
    delegate = account_find(delegate_username)
    if delegate is None or not may_review(user=delegate, tenant=tenant):
        problems["delegate"] = f"not a reviewer of {tenant.slug}"
    elif delegate.pk == user.pk:
        problems["delegate"] = "someone other than you"
    if timezone.is_naive(ends_at) or timezone.is_naive(starts_at):
        problems["ends_at"] = "a timestamp with a time zone"
    elif ends_at <= max(now, starts_at):
        problems["ends_at"] = "after the start, in the future"
    elif ends_at - starts_at > MAX_DELEGATION:
        problems["ends_at"] = "at most 90 days after the start"
    if len(reason) > MAX_COMMENT:
        problems["reason"] = f"at most {MAX_COMMENT} characters"
    if problems:
        raise InvalidRequest("The delegation is not valid; nothing was changed.", fields=problems)
    with transaction.atomic():
        row = Delegation.objects.create(
            tenant=tenant,
            delegator=user,
            delegate=delegate,
            starts_at=starts_at,
            ends_at=ends_at,
            reason=reason,
        )
        audit_record(
            tenant=tenant,
            actor=actor,
            action="delegation.created",
            target=delegate.get_username(),
            reason=reason,
            details={
                "delegation_id": str(row.pk),
                "starts_at": starts_at.isoformat(),
                "ends_at": ends_at.isoformat(),
            },
        )
    return row


def delegation_revoke(*, tenant: Tenant, delegation_id: UUID | str, actor: Actor) -> Delegation:
    """End a delegation now; its delegator or its delegate may. Raises NotFound (anyone
    else's, another tenant's). Audited as ``delegation.revoked``; idempotent."""
    user = actor.user
    with transaction.atomic():
        try:
            row = (
                Delegation.objects.select_for_update()
                .filter(Q(delegator=user) | Q(delegate=user))
                .select_related("delegate")
                .get(tenant=tenant, pk=delegation_id)
            )
        except (Delegation.DoesNotExist, ValueError):
            raise NotFound("No such delegation of yours.")
        if row.revoked_at is None:
            row.revoked_at = timezone.now()
            row.save(update_fields=["revoked_at"])
            audit_record(
                tenant=tenant,
                actor=actor,
                action="delegation.revoked",
                target=row.delegate.get_username(),
                details={"delegation_id": str(row.pk)},
            )
    return row


def delegations_of(*, tenant: Tenant, user: AbstractBaseUser) -> QuerySet[Delegation]:
    """The user's delegations in the tenant, given and received, not yet ended or revoked."""
    return (
        Delegation.objects.filter(
            tenant=tenant, revoked_at__isnull=True, ends_at__gt=timezone.now()
        )
        .filter(Q(delegator=user) | Q(delegate=user))
        .select_related("delegator", "delegate")
        .order_by("ends_at", "id")
    )
