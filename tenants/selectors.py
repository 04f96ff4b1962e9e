"""Which tenant a request acts in, what the caller may do there, and which runs they may
review. The console and the API both read through these; none consults global
permissions or superuser status."""

from __future__ import annotations

from dataclasses import dataclass
from uuid import UUID

from django.contrib.auth.models import AbstractBaseUser
from django.db.models import Q, QuerySet
from django.http import HttpRequest

from tenants import roles
from tenants.models import ApiToken, RunGrant, Tenant, TenantUserObjectPermission
from tenants.services import permissions_of

SESSION_TENANT_KEY = "cairn_tenant_id"


def tenants_of(user: AbstractBaseUser) -> QuerySet[Tenant]:
    """Tenants where the user holds a role or a run grant (object permissions only)."""
    if not user.is_authenticated:
        return Tenant.objects.none()
    return Tenant.objects.filter(
        Q(pk__in=TenantUserObjectPermission.objects.filter(user=user).values("content_object"))
        | Q(pk__in=RunGrant.objects.filter(user=user).values("tenant"))
    )


def request_tenant(request: HttpRequest) -> Tenant | None:
    """The tenant of the token, else the one chosen in the session, else the user's first."""
    cached = getattr(request, "cairn_tenant", None)
    if cached is not None:
        return cached
    user = request.user
    if not user.is_authenticated:
        return None
    chosen = request.session.get(SESSION_TENANT_KEY) if hasattr(request, "session") else None
    tenants = tenants_of(user)
    tenant = (tenants.filter(pk=chosen).first() if chosen else None) or tenants.first()
    request.cairn_tenant = tenant
    return tenant


def request_permissions(request: HttpRequest) -> frozenset[str]:
    cached = getattr(request, "cairn_permissions", None)
    if cached is not None:
        return cached
    tenant = request_tenant(request)
    perms = permissions_of(user=request.user, tenant=tenant) if tenant else frozenset()
    request.cairn_permissions = perms
    return perms


@dataclass(frozen=True)
class ReviewScope:
    """The runs whose approvals a user may see and decide in one tenant: every run (the
    reviewer role), the runs granted to them, or none."""

    tenant: Tenant
    user: AbstractBaseUser | None
    every_run: bool
    granted: bool

    @property
    def nothing(self) -> bool:
        return not self.every_run and not self.granted

    def apply(self, rows: QuerySet, field: str = "run") -> QuerySet:
        """``rows`` (of this tenant) narrowed to the runs in scope."""
        if self.every_run:
            return rows
        if not self.granted:
            return rows.none()
        runs = RunGrant.objects.filter(tenant=self.tenant, user=self.user).values("run_id")
        return rows.filter(**{f"{field}__in": runs})

    def allows(self, run_id: UUID | str) -> bool:
        if self.every_run:
            return True
        return self.granted and (
            RunGrant.objects.filter(tenant=self.tenant, user=self.user, run_id=run_id).exists()
        )


def review_scope(
    *, user: AbstractBaseUser, tenant: Tenant, permissions: frozenset[str] | None = None
) -> ReviewScope:
    """What ``user`` may review in ``tenant``; pass ``permissions`` when already known."""
    perms = permissions_of(user=user, tenant=tenant) if permissions is None else permissions
    return ReviewScope(
        tenant=tenant,
        user=user,
        every_run=roles.REVIEW in perms,
        granted=roles.REVIEW_RUN in perms,
    )


@dataclass
class Member:
    user: AbstractBaseUser
    role: str | None
    tokens: list


def tenant_members(tenant: Tenant) -> list[Member]:
    """The tenant's members with their role and API tokens (live first), in three queries."""
    codenames: dict[int, set[str]] = {}
    users: dict[int, AbstractBaseUser] = {}
    rows = TenantUserObjectPermission.objects.filter(content_object=tenant).select_related(
        "user", "permission"
    )
    for row in rows:
        codenames.setdefault(row.user_id, set()).add(row.permission.codename)
        users[row.user_id] = row.user
    tokens: dict[int, list] = {}
    for token in ApiToken.objects.filter(tenant=tenant).order_by("revoked_at", "-created_at"):
        tokens.setdefault(token.user_id, []).append(token)
    members = [
        Member(user=users[pk], role=roles.role_of(perms), tokens=tokens.get(pk, []))
        for pk, perms in codenames.items()
    ]
    return sorted(members, key=lambda m: m.user.get_username().lower())


def tenant_grants(tenant: Tenant) -> QuerySet[RunGrant]:
    return (
        RunGrant.objects.filter(tenant=tenant)
        .select_related("user", "granted_by", "run")
        .order_by("user__username", "-created_at")
    )
