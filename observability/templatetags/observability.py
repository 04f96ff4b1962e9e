"""Alerts in the console: the list on the health page and the count in the menu."""

from __future__ import annotations

from django import template
from django.utils.html import format_html

from observability.alerts import TenantAlerts, alerts_for_tenant
from tenants import roles
from tenants.selectors import request_permissions, request_tenant

register = template.Library()


def _on_call_tenant(context: template.Context):  # noqa: ANN202
    """The tenant whose alerts this user answers for: operators and admins are on call."""
    request = context.get("request")
    if request is None or not request.user.is_authenticated:
        return None
    tenant = request_tenant(request)
    permissions = request_permissions(request)
    if tenant is None or not (roles.OPERATE in permissions or roles.ADMIN in permissions):
        return None
    return tenant


def _alerts(context: template.Context) -> TenantAlerts | None:
    """Computed once per request: the menu badge and the health page's list share it."""
    tenant = _on_call_tenant(context)
    if tenant is None:
        return None
    request = context["request"]
    cached = getattr(request, "cairn_alerts", None)
    if cached is None:
        cached = request.cairn_alerts = alerts_for_tenant(tenant)
    return cached


@register.inclusion_tag("observability/alerts.html", takes_context=True)
def tenant_alerts(context: template.Context) -> dict[str, object]:
    return {"alerts": _alerts(context)}


@register.simple_tag(takes_context=True)
def alert_badge(context: template.Context) -> str:
    """A count badge for the menu (operators and admins; nothing when there is no alert)."""
    alerts = _alerts(context)
    count = alerts.count if alerts is not None else 0
    if not count:
        return ""
    return format_html(
        ' <span class="badge badge-failed" id="alert-count" title="{} alert{}">{}</span>',
        count,
        "" if count == 1 else "s",
        count,
    )
