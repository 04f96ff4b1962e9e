"""The three roles and what each may do. A role is a set of permissions on the tenant."""

from __future__ import annotations

REVIEW = "review_tenant"
OPERATE = "operate_tenant"
ADMIN = "admin_tenant"

ROLE_PERMISSIONS: dict[str, frozenset[str]] = {
    "reviewer": frozenset({REVIEW}),
    "operator": frozenset({OPERATE}),
    "admin": frozenset({REVIEW, OPERATE, ADMIN}),
}
ROLES = tuple(ROLE_PERMISSIONS)


def role_of(permissions: set[str] | frozenset[str]) -> str | None:
    """The highest role these permissions make up (admin > operator > reviewer)."""
    for role in ("admin", "operator", "reviewer"):
        if ROLE_PERMISSIONS[role] <= permissions:
            return role
    return None
