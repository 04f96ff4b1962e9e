"""Sign-in landing and tenant switching."""

from __future__ import annotations

import uuid

from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_POST

from tenants import roles
from tenants.access import console_view
from tenants.selectors import SESSION_TENANT_KEY, tenants_of


def home(request: HttpRequest) -> HttpResponse:
    """Operators (and admins) land on the runs, everyone else on the review queue: every
    role holds one of the two (a reviewer by role or by a run grant)."""
    if not request.user.is_authenticated:
        return redirect("console:login")
    return _home(request)


@console_view(None)
def _home(request: HttpRequest) -> HttpResponse:
    return redirect("console:runs" if request.console.can(roles.OPERATE) else "approvals:inbox")


@require_POST
def tenant_switch(request: HttpRequest) -> HttpResponse:
    """Make another of the user's tenants the current one (stored in the session)."""
    if not request.user.is_authenticated:
        return redirect("console:login")
    try:
        chosen = uuid.UUID(str(request.POST.get("tenant", "")))
    except ValueError:
        chosen = None  # not an id at all: the same answer as a tenant one is not a member of
    tenant = tenants_of(request.user).filter(pk=chosen).first() if chosen else None
    if tenant is None:
        raise Http404("You are not a member of that tenant.")
    request.session[SESSION_TENANT_KEY] = str(tenant.pk)
    # Pages of the old tenant (a run, a checkpoint) do not exist in the new one: start over,
    # unless the switch was asked for to open a run of the new tenant (the 404's hint).
    wanted = str(request.POST.get("next") or "")
    if wanted.startswith("/runs/") and url_has_allowed_host_and_scheme(
        wanted, allowed_hosts={request.get_host()}
    ):
        return redirect(wanted)
    return redirect("console:home")
