"""Tenants, memberships, API tokens and audit events."""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass, field
from uuid import UUID

from django.contrib.auth import get_user_model
from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction
from django.utils import timezone
from guardian.shortcuts import assign_perm

from tenants import roles
from tenants.models import ApiToken, AuditEvent, Tenant, TenantUserObjectPermission

TOKEN_PREFIX = "cairn_"


@dataclass(frozen=True)
class Actor:
    """Who is acting: a signed-in user or token holder, or a named system process."""

    user: AbstractBaseUser | None = None
    label: str = ""
    ip: str | None = None
    token_id: UUID | None = field(default=None)

    @property
    def name(self) -> str:
        if self.user is not None:
            return self.user.get_username()
        return self.label or "system"

    @classmethod
    def system(cls, label: str) -> Actor:
        return cls(label=label)


def audit_record(
    *,
    tenant: Tenant,
    actor: Actor,
    action: str,
    run_id: UUID | None = None,
    target: str = "",
    reason: str = "",
    details: dict | None = None,
) -> AuditEvent:
    """Append one audit event. Runs inside the caller's transaction when there is one."""
    return AuditEvent.objects.create(
        tenant=tenant,
        actor=actor.user if actor.user is not None and actor.user.pk else None,
        actor_label=actor.name,
        action=action,
        run_id=run_id,
        target=target[:200],
        reason=reason,
        ip=actor.ip,
        details=details or {},
    )


def tenant_create(*, slug: str, name: str = "", owner_username: str) -> tuple[Tenant, bool]:
    """Create the tenant (or find it) and make the owner, created if missing, its admin.

    Atomic. Returns (tenant, created).
    """
    user_model = get_user_model()
    with transaction.atomic():
        tenant, created = Tenant.objects.get_or_create(slug=slug, defaults={"name": name or slug})
        owner, _ = user_model.objects.get_or_create(username=owner_username)
        _set_role(tenant=tenant, user=owner, role="admin")
        audit_record(
            tenant=tenant,
            actor=Actor.system("create_tenant"),
            action="member.role_set",
            target=owner_username,
            details={"role": "admin"},
        )
    return tenant, created


def _set_role(*, tenant: Tenant, user: AbstractBaseUser, role: str | None) -> None:
    TenantUserObjectPermission.objects.filter(user=user, content_object=tenant).delete()
    if role is None:
        return
    for perm in roles.ROLE_PERMISSIONS[role]:
        assign_perm(f"tenants.{perm}", user, tenant)


def member_set_role(
    *, tenant: Tenant, user: AbstractBaseUser, role: str | None, actor: Actor, reason: str = ""
) -> None:
    """Give ``user`` exactly ``role`` in ``tenant`` (None removes the member).

    Atomic with its audit event. Removing a member revokes their tokens for the tenant.
    """
    if role is not None and role not in roles.ROLE_PERMISSIONS:
        raise ValueError(f"unknown role '{role}'; choose one of {', '.join(roles.ROLES)}")
    with transaction.atomic():
        _set_role(tenant=tenant, user=user, role=role)
        if role is None:
            ApiToken.objects.filter(tenant=tenant, user=user, revoked_at__isnull=True).update(
                revoked_at=timezone.now()
            )
        audit_record(
            tenant=tenant,
            actor=actor,
            action="member.removed" if role is None else "member.role_set",
            target=user.get_username(),
            reason=reason,
            details={"role": role},
        )


def permissions_of(*, user: AbstractBaseUser, tenant: Tenant) -> frozenset[str]:
    """The user's permission codenames on the tenant: one indexed query, no global perms."""
    if not user.is_authenticated or not user.is_active:
        return frozenset()
    return frozenset(
        TenantUserObjectPermission.objects.filter(user=user, content_object=tenant).values_list(
            "permission__codename", flat=True
        )
    )


def _digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def token_issue(
    *, tenant: Tenant, user: AbstractBaseUser, actor: Actor, name: str = ""
) -> tuple[ApiToken, str]:
    """Create an API token and return it with its secret, which is never stored or shown again."""
    secret = TOKEN_PREFIX + secrets.token_urlsafe(32)
    with transaction.atomic():
        token = ApiToken.objects.create(
            tenant=tenant,
            user=user,
            name=name,
            prefix=secret[: len(TOKEN_PREFIX) + 6],
            key_sha256=_digest(secret),
        )
        audit_record(
            tenant=tenant,
            actor=actor,
            action="token.issued",
            target=f"{token.prefix}… for {user.get_username()}",
        )
    return token, secret


def token_revoke(*, token: ApiToken, actor: Actor) -> None:
    with transaction.atomic():
        ApiToken.objects.filter(pk=token.pk, revoked_at__isnull=True).update(
            revoked_at=timezone.now()
        )
        audit_record(
            tenant=token.tenant, actor=actor, action="token.revoked", target=f"{token.prefix}…"
        )


def token_authenticate(secret: str) -> ApiToken | None:
    """The live token for this secret, with user and tenant loaded; None if unknown or revoked.

    A token whose user no longer holds any role in its tenant does not authenticate.
    """
    if not secret.startswith(TOKEN_PREFIX) or len(secret) > 200:
        return None
    token = (
        ApiToken.objects.select_related("user", "tenant")
        .filter(key_sha256=_digest(secret), revoked_at__isnull=True, user__is_active=True)
        .first()
    )
    if token is None or not permissions_of(user=token.user, tenant=token.tenant):
        return None
    now = timezone.now()
    if token.last_used_at is None or (now - token.last_used_at).total_seconds() > 60:
        # Coarse, so a busy token does not turn every read into a write.
        ApiToken.objects.filter(pk=token.pk).update(last_used_at=now)
    return token
