"""Reviewer groups: named sets of a tenant's members that an approval state may declare as
the people who decide it (``"reviewers": {"group": "legal"}``). An admin manages them (the
console's groups page, ``/api/v1/reviewer-groups``); every change is audited. A group and
its memberships belong to one tenant: only the tenant's members can be added, and another
tenant's group of the same name is another group.

Membership alone lets no one decide: the decision also needs the review role (or a grant of
the run) and the four-eyes rule (``approvals.services.standing.reviewer_refusal``).
"""

from __future__ import annotations

import re

from django.db import IntegrityError, transaction
from django.db.models import QuerySet

from cairn.errors import GroupExists, InvalidRequest, NotFound
from tenants.models import ReviewerGroup, ReviewerGroupMember, Tenant
from tenants.services import Actor, audit_record, permissions_of
from tenants.usernames import account_find

# A group's name: what a workflow definition names it by.
GROUP_NAME = re.compile(r"[a-z0-9][a-z0-9_-]{0,63}")
NAME_HINT = "1-64 lowercase letters, digits, - and _, starting with a letter or digit"


def reviewer_groups_of(*, tenant: Tenant) -> QuerySet[ReviewerGroup]:
    """The tenant's groups by name, their memberships prefetched (``member_names``)."""
    return (
        ReviewerGroup.objects.filter(tenant=tenant)
        .prefetch_related("memberships__user")
        .order_by("name", "id")
    )


def reviewer_group_get(*, tenant: Tenant, name: str) -> ReviewerGroup:
    """One group of the tenant, or NotFound (another tenant's group is not disclosed)."""
    group = reviewer_groups_of(tenant=tenant).filter(name=name).first()
    if group is None:
        raise NotFound(f"No reviewer group '{name}' in {tenant.slug}.")
    return group


def member_names(group: ReviewerGroup) -> list[str]:
    """The group's members' usernames, sorted (from the prefetched memberships)."""
    return sorted(row.user.get_username() for row in group.memberships.all())


def _group(tenant: Tenant, name: str) -> ReviewerGroup:
    group = ReviewerGroup.objects.filter(tenant=tenant, name=name).first()
    if group is None:
        raise NotFound(f"No reviewer group '{name}' in {tenant.slug}.")
    return group


def reviewer_group_create(*, tenant: Tenant, name: str, actor: Actor) -> ReviewerGroup:
    """A new, empty group. Raises InvalidRequest (the name) or GroupExists."""
    name = (name or "").strip()
    if not GROUP_NAME.fullmatch(name):
        raise InvalidRequest(
            f"A reviewer group's name is {NAME_HINT}, e.g. legal.", fields={"name": NAME_HINT}
        )
    try:
        with transaction.atomic():
            group = ReviewerGroup.objects.create(tenant=tenant, name=name)
            audit_record(tenant=tenant, actor=actor, action="reviewer_group.created", target=name)
    except IntegrityError:
        raise GroupExists(f"{tenant.slug} already has a reviewer group '{name}'.")
    return group


def reviewer_group_delete(*, tenant: Tenant, name: str, actor: Actor) -> None:
    """Delete the group and its memberships. Requests that name it can then be decided by
    no one until a group of that name exists again. Raises NotFound."""
    with transaction.atomic():
        group = _group(tenant, name)
        members = list(group.memberships.values_list("user__username", flat=True))
        group.delete()
        audit_record(
            tenant=tenant,
            actor=actor,
            action="reviewer_group.deleted",
            target=name,
            details={"members": sorted(members)},
        )


def reviewer_group_member_add(
    *, tenant: Tenant, name: str, username: str, actor: Actor
) -> ReviewerGroupMember:
    """Add the tenant's member ``username`` to the group (idempotent). Raises NotFound (the
    group) or InvalidRequest (not a member of the tenant; the same sentence whether or not
    the account exists elsewhere)."""
    with transaction.atomic():
        group = _group(tenant, name)
        user = account_find(username)
        if user is None or not permissions_of(user=user, tenant=tenant):
            raise InvalidRequest(
                f"'{username}' is not a member of {tenant.slug}; only the tenant's members can "
                "be in its reviewer groups.",
                fields={"username": "not a member of the tenant"},
            )
        row, created = ReviewerGroupMember.objects.get_or_create(
            group=group,
            user=user,
            defaults={"added_by": actor.user if actor.user is not None and actor.user.pk else None},
        )
        if created:
            audit_record(
                tenant=tenant,
                actor=actor,
                action="reviewer_group.member_added",
                target=name,
                details={"username": user.get_username()},
            )
    return row


def reviewer_group_member_remove(*, tenant: Tenant, name: str, username: str, actor: Actor) -> None:
    """Take ``username`` out of the group. Raises NotFound (the group, or not in it)."""
    with transaction.atomic():
        group = _group(tenant, name)
        user = account_find(username)
        row = group.memberships.filter(user=user).first() if user is not None else None
        if row is None:
            raise NotFound(f"'{username}' is not in the reviewer group '{name}'.")
        row.delete()
        audit_record(
            tenant=tenant,
            actor=actor,
            action="reviewer_group.member_removed",
            target=name,
            details={"username": user.get_username()},
        )
