"""The operator actions panel of the run page: which actions the run offers, as buttons that
load each action's form into the panel (htmx) or open it as a page (without script)."""

from __future__ import annotations

from django import template

from console.actions import actions_available
from tenants import roles

register = template.Library()


@register.inclusion_tag("console/actions/panel.html", takes_context=True)
def actions_panel(context: template.Context) -> dict[str, object]:
    access = context.get("access")
    run = context.get("run")
    if run is None or access is None or not access.can(roles.OPERATE):
        return {"show": False}
    return {
        "show": True,
        "run": run,
        **actions_available(run, context.get("operations") or []),
    }
