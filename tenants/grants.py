"""Per-run grants: one user may review one run's approvals without the tenant's other runs."""

from __future__ import annotations

from typing import Any
from uuid import UUID

from django.contrib.auth.models import AbstractBaseUser
from django.core.exceptions import ValidationError
from django.db import transaction

from cairn.errors import NotFound
from tenants.models import RunGrant, Tenant
from tenants.services import Actor, audit_record, permissions_of
from tenants.usernames import account_find


def tenant_run_get(*, tenant: Tenant, run_id: UUID | str) -> Any:
    """The tenant's run ``run_id``, or None. Tenants sit below the store and never import
    it: they reach a run through the foreign key a grant declares (``checkpoints.Run``)."""
    run_model = RunGrant._meta.get_field("run").related_model
    try:
        return run_model.objects.only("id", "tenant_id").filter(tenant=tenant, pk=run_id).first()
    except (ValueError, TypeError, ValidationError):
        return None


def run_grant_create(
    *, tenant: Tenant, run_id: UUID | str, user: AbstractBaseUser, actor: Actor
) -> RunGrant:
    """Let ``user`` review the approvals of one run of the tenant (idempotent).

    Whoever ``user`` is: callers decide who may receive a grant (``run_grant_to_member``,
    ``member_invite``). Atomic with its audit event. Raises NotFound when the run is not
    the tenant's.
    """
    run = tenant_run_get(tenant=tenant, run_id=run_id)
    if run is None:
        raise NotFound("No such run in this tenant.")
    with transaction.atomic():
        grant, created = RunGrant.objects.get_or_create(
            run=run,
            user=user,
            defaults={
                "tenant": tenant,
                "granted_by": actor.user if actor.user is not None and actor.user.pk else None,
            },
        )
        if created:
            audit_record(
                tenant=tenant,
                actor=actor,
                action="grant.created",
                run_id=run.pk,
                target=user.get_username(),
            )
    return grant


def run_grant_to_member(
    *, tenant: Tenant, run_id: UUID | str, username: str, actor: Actor
) -> RunGrant:
    """Let the member ``username`` of the tenant (a role, or a run grant, here) review one
    more run: the members page's grant form. Someone from outside comes in by invitation
    (``member_invite``), which says whom the admin let in.

    Raises NotFound with ``fields={"username": …}`` for a username that is not a member,
    with the same sentence whether or not the account exists (or belongs elsewhere), and
    NotFound (the run) as ``run_grant_create``.
    """
    user = account_find(username)
    if user is None or not permissions_of(user=user, tenant=tenant):
        raise NotFound(
            f"No member of {tenant.slug} has that username; to let someone else review one "
            "run, invite them as a reviewer of one run.",
            fields={"username": "not a member"},
        )
    return run_grant_create(tenant=tenant, run_id=run_id, user=user, actor=actor)


def run_grant_revoke(*, tenant: Tenant, grant_id: UUID | str, actor: Actor) -> None:
    """Withdraw a run grant; the user loses sight of the run with their next request.

    Atomic with its audit event. Raises NotFound for another tenant's grant.
    """
    with transaction.atomic():
        try:
            grant = (
                RunGrant.objects.select_for_update()
                .select_related("user")
                .get(tenant=tenant, pk=grant_id)
            )
        except (RunGrant.DoesNotExist, ValueError):
            raise NotFound("No such run grant.")
        run_id, username = grant.run_id, grant.user.get_username()
        grant.delete()
        audit_record(
            tenant=tenant, actor=actor, action="grant.revoked", run_id=run_id, target=username
        )
