"""Who may open a console page: signed in, a member of the current tenant, with the role.

Every console view is wrapped by ``console_view``. Lookups inside views are scoped by
``request.console.tenant`` so another tenant's run is a 404, while a missing role in the
caller's own tenant is a 403 (the caller may know the page exists, just not use it).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import wraps

from django.conf import settings
from django.contrib.auth.views import redirect_to_login
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.shortcuts import resolve_url
from django.utils.http import urlencode
from django_htmx.http import HttpResponseClientRedirect

from tenants.models import Tenant
from tenants.selectors import request_permissions, request_tenant
from tenants.services import Actor


@dataclass(frozen=True)
class ConsoleAccess:
    tenant: Tenant
    permissions: frozenset[str]
    actor: Actor

    def can(self, permission: str) -> bool:
        return permission in self.permissions


def console_view(
    permission: str | tuple[str, ...] | None,
) -> Callable[[Callable[..., HttpResponse]], Callable[..., HttpResponse]]:
    """Require sign-in, a current tenant and (any of) ``permission`` in it.

    ``None`` means any member of the tenant. Sets ``request.console`` (ConsoleAccess).
    """
    needed = (permission,) if isinstance(permission, str) else tuple(permission or ())

    def decorate(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
        @wraps(view)
        def wrapped(request: HttpRequest, *args: object, **kwargs: object) -> HttpResponse:
            if not request.user.is_authenticated:
                return _to_login(request)
            tenant = request_tenant(request)
            if tenant is None:
                raise PermissionDenied("You are not a member of any tenant yet.")
            perms = request_permissions(request)
            if needed and not any(p in perms for p in needed):
                raise PermissionDenied("Your role in this tenant does not allow this page.")
            request.console = ConsoleAccess(
                tenant=tenant,
                permissions=perms,
                actor=Actor(user=request.user, ip=request.META.get("REMOTE_ADDR")),
            )
            return view(request, *args, **kwargs)

        wrapped.console_permission = needed  # type: ignore[attr-defined]
        return wrapped

    return decorate


def _to_login(request: HttpRequest) -> HttpResponse:
    # An htmx poll from an expired session must move the whole page, not swap a login
    # form into a table row.
    if getattr(request, "htmx", False):
        login = resolve_url(settings.LOGIN_URL)
        current = request.htmx.current_url_abs_path or "/"
        return HttpResponseClientRedirect(f"{login}?{urlencode({'next': current})}")
    return redirect_to_login(request.get_full_path())
