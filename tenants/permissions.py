"""DRF permission: the caller holds the view's required role permission in their tenant.

Views name ``required_permission`` (one of tenants.roles' codenames, or a tuple of which
any one will do), or a mapping from HTTP method to codename in ``required_permissions``.
"""

from __future__ import annotations

from rest_framework import permissions

from tenants.selectors import request_permissions, request_tenant


class HasTenantRole(permissions.BasePermission):
    message = "Your role in this tenant does not allow this."

    def has_permission(self, request, view) -> bool:  # noqa: ANN001
        if not request.user or not request.user.is_authenticated:
            return False
        if request_tenant(request._request) is None:
            self.message = "You are not a member of any tenant."
            return False
        return view_allows(view, request.method, request_permissions(request._request))


def view_allows(view: object, method: str, held: frozenset[str]) -> bool:
    """Whether ``held`` (a member's permission codenames) includes what ``view`` requires
    for ``method``."""
    by_method = getattr(view, "required_permissions", None)
    needed = (by_method or {}).get(method) or getattr(view, "required_permission", None)
    if not needed:
        return False  # a view that names no permission is closed, not open
    if isinstance(needed, str):
        return needed in held
    return any(codename in held for codename in needed)
