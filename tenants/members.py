"""Inviting members: a new user with a role (or a run grant) and a one-time link to set
their password. The link is never stored; it is shown to the inviting admin once."""

from __future__ import annotations

from dataclasses import dataclass
from uuid import UUID

from django.contrib.auth import get_user_model
from django.contrib.auth.models import AbstractBaseUser
from django.contrib.auth.tokens import default_token_generator
from django.core.exceptions import ValidationError
from django.db import transaction
from django.urls import reverse
from django.utils.encoding import force_bytes
from django.utils.http import urlsafe_base64_encode

from checkpoints.errors import AlreadyMember, InvalidRequest
from tenants import roles
from tenants.grants import run_grant_create
from tenants.models import RunGrant, Tenant, TenantUserObjectPermission
from tenants.services import Actor, audit_record, member_set_role, permissions_of


@dataclass(frozen=True)
class Invitation:
    user: AbstractBaseUser
    created: bool
    # Site-relative path of the one-time set-password link; None when the user already has
    # a password (or other tenants rely on the account, so this tenant may not reset it).
    set_password_path: str | None


def member_invite(
    *,
    tenant: Tenant,
    username: str,
    email: str = "",
    role: str | None,
    run_id: UUID | str | None = None,
    actor: Actor,
) -> Invitation:
    """Add ``username`` to the tenant with ``role``, or, with ``role`` None, as the reviewer
    of the one run ``run_id``. Creates the user (without a usable password) if missing.

    Atomic: the user, the role or grant and the audit events are written together. Raises
    InvalidRequest (bad username, unknown role, neither role nor run), AlreadyMember (the
    user already holds a role here), NotFound (the run is not the tenant's).
    """
    username = (username or "").strip()
    user_model = get_user_model()
    try:
        user_model.username_validator(username)
    except ValidationError:
        raise InvalidRequest(
            "A username has letters, digits and @ . + - _ only.", fields={"username": "invalid"}
        )
    if not username or len(username) > 150:
        raise InvalidRequest("A username has 1 to 150 characters.", fields={"username": "length"})
    if role is None and not run_id:
        raise InvalidRequest(
            "Choose a role, or a run for a reviewer of one run.", fields={"role": "required"}
        )
    with transaction.atomic():
        user = user_model.objects.filter(username=username).first()
        created = user is None
        if created:
            user = user_model(username=username, email=(email or "").strip()[:254])
            user.set_unusable_password()
            user.save()
        elif role is not None and roles.role_of(permissions_of(user=user, tenant=tenant)):
            raise AlreadyMember(
                f"{username} is already a member of {tenant.slug}; change their role instead."
            )
        if role is not None:
            member_set_role(tenant=tenant, user=user, role=role, actor=actor)
        else:
            run_grant_create(tenant=tenant, run_id=run_id, user=user, actor=actor)
        audit_record(
            tenant=tenant,
            actor=actor,
            action="member.invited",
            target=username,
            details={"role": role, "run_id": str(run_id) if run_id else None, "new": created},
        )
        path = _set_password_path(user) if _may_set_password(user, tenant) else None
    return Invitation(user=user, created=created, set_password_path=path)


def member_password_link(*, tenant: Tenant, user: AbstractBaseUser, actor: Actor) -> str:
    """A fresh one-time set-password link for a member who has not set a password yet.

    Raises InvalidRequest when the user has a password, or belongs to another tenant too
    (an admin here must not be able to take over an account others rely on).
    """
    if not _may_set_password(user, tenant):
        raise InvalidRequest(
            f"{user.get_username()} has set a password already (or belongs to another tenant "
            "too); they can sign in, or ask their own admin."
        )
    with transaction.atomic():
        audit_record(tenant=tenant, actor=actor, action="member.link_issued", target=user.username)
    return _set_password_path(user)


def _may_set_password(user: AbstractBaseUser, tenant: Tenant) -> bool:
    if user.has_usable_password() or user.is_staff or user.is_superuser:
        return False
    elsewhere = (
        TenantUserObjectPermission.objects.filter(user=user).exclude(content_object=tenant).exists()
        or RunGrant.objects.filter(user=user).exclude(tenant=tenant).exists()
    )
    return not elsewhere


def _set_password_path(user: AbstractBaseUser) -> str:
    # Django's reset token: it stops working once the password is set (the password hash
    # is part of it) and after PASSWORD_RESET_TIMEOUT.
    return reverse(
        "tenants:set_password",
        kwargs={
            "uidb64": urlsafe_base64_encode(force_bytes(user.pk)),
            "token": default_token_generator.make_token(user),
        },
    )
