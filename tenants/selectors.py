"""Which tenant a request acts in, and what the caller may do there."""

from __future__ import annotations

from django.contrib.auth.models import AbstractBaseUser
from django.db.models import QuerySet
from django.http import HttpRequest

from tenants.models import Tenant
from tenants.services import permissions_of

SESSION_TENANT_KEY = "cairn_tenant_id"


def tenants_of(user: AbstractBaseUser) -> QuerySet[Tenant]:
    """Tenants where the user holds any role (object permissions only, never global ones)."""
    if not user.is_authenticated:
        return Tenant.objects.none()
    return Tenant.objects.filter(tenantuserobjectpermission__user=user).distinct()


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
