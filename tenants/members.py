"""Inviting members: an invitation with a role (or a run grant) and a one-time link the
invited person answers through. The link is never stored (only its sha256); it is shown to
the inviting admin once. Nothing is granted before the person answers."""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass
from uuid import UUID

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import AbstractBaseUser
from django.contrib.auth.tokens import default_token_generator
from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction
from django.urls import reverse
from django.utils import timezone
from django.utils.encoding import force_bytes
from django.utils.http import urlsafe_base64_encode

from cairn.errors import AlreadyMember, InvalidRequest, NotFound
from tenants import roles
from tenants.grants import run_grant_create, tenant_run_get
from tenants.models import MemberInvitation, RunGrant, Tenant, TenantUserObjectPermission
from tenants.services import Actor, audit_record, member_set_role, permissions_of
from tenants.usernames import account_find, same_account_name, username_key


@dataclass(frozen=True)
class Invitation:
    username: str
    # Site-relative path of the one-time link the invited person answers through. The same
    # kind of link whether or not the username has an account: the answer to the admin
    # says nothing about other tenants' accounts.
    link_path: str


def _username_check(username: str) -> str:
    """The username as an account is made with: its key (NFKC, case-folded)."""
    username = username_key(username)
    try:
        get_user_model().username_validator(username)
    except ValidationError:
        raise InvalidRequest(
            "A username has letters, digits and @ . + - _ only.", fields={"username": "invalid"}
        )
    if not username or len(username) > 150:
        raise InvalidRequest("A username has 1 to 150 characters.", fields={"username": "length"})
    return username


def member_invite(
    *,
    tenant: Tenant,
    username: str,
    email: str = "",
    role: str | None,
    run_id: UUID | str | None = None,
    actor: Actor,
) -> Invitation:
    """Invite ``username`` into the tenant with ``role``, or, with ``role`` None, as the
    reviewer of the one run ``run_id``. Grants nothing and creates no account: the person
    answers through the returned one-time link (``invitation_accept``), so an admin cannot
    enrol an account of another tenant without its holder's consent. The answer is the same
    whether or not the username exists. An open invitation of the same username here is
    replaced (its link stops working).

    Atomic with its audit event. Raises InvalidRequest (bad username, unknown role, neither
    role nor run), AlreadyMember (the user already holds a role here: the admin sees them in
    the members list anyway), NotFound (the run is not the tenant's).
    """
    username = _username_check(username)
    if role is None and not run_id:
        raise InvalidRequest(
            "Choose a role, or a run for a reviewer of one run.", fields={"role": "required"}
        )
    if role is not None and role not in roles.ROLE_PERMISSIONS:
        raise InvalidRequest(
            f"Unknown role '{role}'; choose one of {', '.join(roles.ROLES)}.",
            fields={"role": "not a role"},
        )
    run = None
    if role is None:
        run = tenant_run_get(tenant=tenant, run_id=run_id)
        if run is None:
            raise NotFound("No such run in this tenant.")
    # A look-alike (``Bob``, ``ｂｏｂ``) means the existing account: its holder is invited,
    # and no second account that reads the same is ever made beside it.
    existing = account_find(username)
    if existing is not None:
        username = existing.get_username()
    if (
        existing is not None
        and role is not None
        and roles.role_of(permissions_of(user=existing, tenant=tenant))
    ):
        raise AlreadyMember(
            f"{username} is already a member of {tenant.slug}; change their role instead."
        )
    secret = secrets.token_urlsafe(32)
    now = timezone.now()
    with transaction.atomic():
        MemberInvitation.objects.filter(
            tenant=tenant, username=username, answered_at__isnull=True
        ).update(answered_at=now, accepted=False)
        invitation = MemberInvitation.objects.create(
            tenant=tenant,
            username=username,
            email=(email or "").strip()[:254],
            role=role or "",
            run=run,
            invited_by=actor.user if actor.user is not None and actor.user.pk else None,
            token_sha256=_digest(secret),
        )
        audit_record(
            tenant=tenant,
            actor=actor,
            action="member.invited",
            target=username,
            details={"role": role, "run_id": str(run.pk) if run else None},
        )
    path = reverse("tenants:invitation", kwargs={"invitation_id": invitation.pk, "token": secret})
    return Invitation(username=username, link_path=path)


def _digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def invitation_open(*, invitation_id: UUID | str, token: str) -> MemberInvitation | None:
    """The open, unexpired invitation this link names, or None (unknown, answered,
    replaced, expired after ``CAIRN_INVITE_LINK_SECONDS``, or the wrong token)."""
    invitation = (
        MemberInvitation.objects.select_related("tenant", "run")
        .filter(pk=invitation_id, answered_at__isnull=True)
        .first()
    )
    if invitation is None or not hmac.compare_digest(invitation.token_sha256, _digest(token)):
        return None
    age = (timezone.now() - invitation.created_at).total_seconds()
    return invitation if age <= settings.PASSWORD_RESET_TIMEOUT else None


def _answer(invitation: MemberInvitation, *, accepted: bool) -> bool:
    """Close the invitation once (a second answer, racing or later, finds it closed)."""
    return bool(
        MemberInvitation.objects.filter(pk=invitation.pk, answered_at__isnull=True).update(
            answered_at=timezone.now(), accepted=accepted
        )
    )


def invitation_accept(
    *, invitation: MemberInvitation, user: AbstractBaseUser, actor: Actor
) -> None:
    """The account holder accepts: the role (or run grant) is theirs from now on.

    Atomic with its audit events. Raises InvalidRequest when ``user`` is not the invited
    username or the invitation was answered meanwhile."""
    if not same_account_name(user.get_username(), invitation.username):
        raise InvalidRequest(f"This invitation is for {invitation.username}, not for you.")
    with transaction.atomic():
        if not _answer(invitation, accepted=True):
            raise InvalidRequest("This invitation was answered already.")
        if invitation.role:
            member_set_role(tenant=invitation.tenant, user=user, role=invitation.role, actor=actor)
        else:
            run_grant_create(
                tenant=invitation.tenant, run_id=invitation.run_id, user=user, actor=actor
            )
        _audit_answer(invitation, user=user, actor=actor, action="member.joined")


def invitation_accept_new(
    *, invitation: MemberInvitation, password: str, ip: str | None = None
) -> bool:
    """A username without an account accepts by choosing its password: the account is
    created and joins. Returns False, and changes nothing, when the username has an account
    by now: its holder accepts by signing in (the caller answers the same either way, so
    the link does not tell who has an account). Atomic."""
    user_model = get_user_model()
    with transaction.atomic():
        if account_find(invitation.username) is not None:
            return False
        user = user_model(username=username_key(invitation.username), email=invitation.email)
        user.set_password(password)
        try:
            with transaction.atomic():
                user.save()
        except IntegrityError:  # created by a racing request: someone else's account
            return False
        invitation_accept(invitation=invitation, user=user, actor=Actor(user=user, ip=ip))
        audit_record(
            tenant=invitation.tenant,
            actor=Actor(user=user, ip=ip),
            action="member.password_set",
            target=user.get_username(),
        )
    return True


def invitation_decline(
    *, invitation: MemberInvitation, user: AbstractBaseUser, actor: Actor
) -> None:
    """The account holder declines; nothing is granted. Atomic with its audit event."""
    if not same_account_name(user.get_username(), invitation.username):
        raise InvalidRequest(f"This invitation is for {invitation.username}, not for you.")
    with transaction.atomic():
        if not _answer(invitation, accepted=False):
            raise InvalidRequest("This invitation was answered already.")
        _audit_answer(invitation, user=user, actor=actor, action="member.declined")


def _audit_answer(
    invitation: MemberInvitation, *, user: AbstractBaseUser, actor: Actor, action: str
) -> None:
    """The audit event of an answer: who answered, and what the invitation offered."""
    audit_record(
        tenant=invitation.tenant,
        actor=actor,
        action=action,
        target=user.get_username(),
        details={"role": invitation.role or None, "run_id": _run_id(invitation)},
    )


def _run_id(invitation: MemberInvitation) -> str | None:
    return str(invitation.run_id) if invitation.run_id else None


def invitations_open(tenant: Tenant) -> list[MemberInvitation]:
    """The tenant's invitations nobody has answered yet (expired ones included), newest first."""
    return list(
        MemberInvitation.objects.filter(tenant=tenant, answered_at__isnull=True).order_by(
            "-created_at"
        )[:200]
    )


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
