"""The three roles and what each may do. A role is a set of permissions on the tenant.

``REVIEW_RUN`` is not a guardian permission: a user holds it in a tenant while they hold a
per-run grant there (tenants.models.RunGrant). It lets pages that narrow their rows to the
granted runs (the approval pages) admit them; no tenant-wide page accepts it.
"""

from __future__ import annotations

REVIEW = "review_tenant"
OPERATE = "operate_tenant"
ADMIN = "admin_tenant"
REVIEW_RUN = "review_granted_runs"

# Review pages admit a tenant reviewer (every run) or a holder of run grants (those runs).
REVIEWERS = (REVIEW, REVIEW_RUN)

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
