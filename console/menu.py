"""The console menu: each entry is shown only to roles that may use it.

Other apps add their pages here (one line each). An entry whose URL does not exist yet
is left out, so a page from a later issue appears once its app registers the URL.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.urls import NoReverseMatch, reverse

from tenants import roles


@dataclass(frozen=True)
class MenuItem:
    label: str
    url_name: str
    permission: str | tuple[str, ...]  # any one of them shows the entry
    section: str  # URL names starting with this prefix mark the entry as current


MENU: tuple[MenuItem, ...] = (
    MenuItem("Runs", "console:runs", roles.OPERATE, "console:run"),
    MenuItem("Approvals", "approvals:inbox", roles.REVIEWERS, "approvals:"),
    MenuItem("Health", "console:health", roles.OPERATE, "console:health"),
    MenuItem("Members", "tenants:members", roles.ADMIN, "tenants:members"),
    MenuItem("Audit log", "tenants:audit", roles.OPERATE, "tenants:audit"),
    MenuItem("Retention", "console:retention", roles.ADMIN, "console:retention"),
    MenuItem(
        "API tokens",
        "tenants:my_tokens",
        (roles.REVIEW, roles.OPERATE, roles.ADMIN, roles.REVIEW_RUN),
        "tenants:my_tokens",
    ),
)


def menu_for(permissions: frozenset[str], current_view: str = "") -> list[dict[str, object]]:
    items = []
    for item in MENU:
        needed = (item.permission,) if isinstance(item.permission, str) else item.permission
        if not any(p in permissions for p in needed):
            continue
        try:
            url = reverse(item.url_name)
        except NoReverseMatch:
            continue
        items.append(
            {"label": item.label, "url": url, "current": current_view.startswith(item.section)}
        )
    return items
