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

from cairn.credentials import free_text_refuse
from cairn.errors import InvalidRequest, LastAdmin, TokenNotYours
from tenants import roles
from tenants.models import ApiToken, AuditEvent, RunGrant, Tenant, TenantUserObjectPermission
from tenants.token_sql import held_by, token_row
from tenants.usernames import account_find, username_key

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
        owner = account_find(owner_username) or user_model.objects.create(
            username=username_key(owner_username)
        )
        if not owner.password:
            # An empty hash looks usable to Django yet matches nothing: mark it unusable, so
            # the owner can be sent a set-password link.
            owner.set_unusable_password()
            owner.save(update_fields=["password"])
        _set_role(tenant=tenant, user=owner, role="admin")
        audit_record(
            tenant=tenant,
            actor=Actor.system("create_tenant"),
            action="member.role_set",
            target=owner.get_username(),
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

    Atomic with its audit event. Removing a member revokes their tokens and run grants in
    the tenant at once. Raises InvalidRequest for an unknown role and LastAdmin when the
    change would leave the tenant without an admin (checked under a lock on the tenant, so
    two admins demoting each other cannot both succeed).
    """
    if role is not None and role not in roles.ROLE_PERMISSIONS:
        raise InvalidRequest(
            f"Unknown role '{role}'; choose one of {', '.join(roles.ROLES)}.",
            fields={"role": "not a role"},
        )
    with transaction.atomic():
        Tenant.objects.select_for_update().filter(pk=tenant.pk).first()
        was_admin = roles.ADMIN in permissions_of(user=user, tenant=tenant)
        if was_admin and role != "admin" and _admin_count(tenant) <= 1:
            raise LastAdmin(
                f"{user.get_username()} is the only admin of {tenant.slug}; make someone else "
                "admin first. Nothing was changed."
            )
        _set_role(tenant=tenant, user=user, role=role)
        if role is None:
            ApiToken.objects.filter(tenant=tenant, user=user, revoked_at__isnull=True).update(
                revoked_at=timezone.now()
            )
            RunGrant.objects.filter(tenant=tenant, user=user).delete()
        audit_record(
            tenant=tenant,
            actor=actor,
            action="member.removed" if role is None else "member.role_set",
            target=user.get_username(),
            reason=reason,
            details={"role": role},
        )


def _admin_count(tenant: Tenant) -> int:
    return (
        TenantUserObjectPermission.objects.filter(
            content_object=tenant, permission__codename=roles.ADMIN, user__is_active=True
        )
        .values("user")
        .distinct()
        .count()
    )


def permissions_of(*, user: AbstractBaseUser, tenant: Tenant) -> frozenset[str]:
    """The user's permission codenames on the tenant, plus ``roles.REVIEW_RUN`` while they
    hold a run grant there (``tenants.token_sql``: one statement, never global perms or
    superuser status)."""
    if not user.is_authenticated or not user.is_active:
        return frozenset()
    return held_by(user_id=user.pk, tenant_id=tenant.pk)


def _digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def token_issue(
    *, tenant: Tenant, user: AbstractBaseUser, actor: Actor, name: str = ""
) -> tuple[ApiToken, str]:
    """Create an API token and return it with its secret, which is never stored or shown again.

    A person mints tokens only for themselves: a token acts with its owner's roles, so an
    admin minting one for someone else (of another tenant too) would hold their access.
    A system actor (the ``issue_token`` command, run on the host) may name anyone.

    Atomic with its audit event. Raises TokenNotYours (403) for a person minting another's
    token, and InvalidRequest when the user holds no role (or run grant) in the tenant: such
    a token could never authenticate.
    """
    free_text_refuse({"name": name}, hint="(the label is shown in the clear)")
    if actor.user is not None and actor.user.pk != user.pk:
        raise TokenNotYours(
            f"An API token is minted by its owner: {user.get_username()} signs in and issues "
            "it on their tokens page. Nothing was issued."
        )
    if not permissions_of(user=user, tenant=tenant):
        raise InvalidRequest(
            f"{user.get_username()} is not a member of {tenant.slug}; add them first.",
            fields={"user": "not a member"},
        )
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


def token_revoke(*, token: ApiToken, actor: Actor) -> bool:
    """Revoke the token: it stops authenticating with the next request.

    Atomic with its audit event. Returns False (and records nothing) when it was already
    revoked.
    """
    with transaction.atomic():
        changed = ApiToken.objects.filter(pk=token.pk, revoked_at__isnull=True).update(
            revoked_at=timezone.now()
        )
        if not changed:
            return False
        audit_record(
            tenant=token.tenant,
            actor=actor,
            action="token.revoked",
            target=f"{token.prefix}… of {token.user.get_username()}",
        )
    return True


def token_authenticate(secret: str) -> ApiToken | None:
    """The live token for this secret, with user and tenant loaded; None if unknown or revoked.

    A token whose user no longer holds any role in its tenant does not authenticate. The
    permissions, found in the token's own query, are kept on the token
    (``token.permissions``) for the request.
    """
    digest = token_digest(secret)
    return None if digest is None else token_accept(token_row(digest))


def token_digest(secret: str) -> str | None:
    """The digest a token with this secret is stored under; None for a secret no token of
    Cairn's can have (then nothing is looked up)."""
    if not secret.startswith(TOKEN_PREFIX) or len(secret) > 200:
        return None
    return _digest(secret)


def token_accept(found: tuple[ApiToken, frozenset[str]] | None) -> ApiToken | None:
    """The token that a row found by its digest authenticates (``token_row``'s, or a
    statement that reads it with more, ``commit_sql.token_head_read``): None when there is
    none or its member holds no permission in its tenant. Its use is recorded, at most once
    a minute."""
    if found is None:
        return None
    # Found by the same statement, by the same rule as ``permissions_of``.
    token, token.permissions = found
    if not token.permissions:
        return None
    now = timezone.now()
    if token.last_used_at is None or (now - token.last_used_at).total_seconds() > 60:
        # Coarse, so a busy token does not turn every read into a write.
        ApiToken.objects.filter(pk=token.pk).update(last_used_at=now)
    return token
