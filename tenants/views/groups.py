"""The reviewer groups page (admins): create and delete groups, add and remove members.

Thin: the services (``tenants.reviewer_groups``) check and audit; a refusal re-renders the
page with its sentence and status, never a silent success.
"""

from __future__ import annotations

from django.contrib import messages
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET, require_POST

from cairn.errors import CairnError
from tenants import roles
from tenants.access import console_view
from tenants.reviewer_groups import (
    member_names,
    reviewer_group_create,
    reviewer_group_delete,
    reviewer_group_member_add,
    reviewer_group_member_remove,
    reviewer_groups_of,
)


def _page(request: HttpRequest, status: int = 200, refusal: str = "") -> HttpResponse:
    groups = [
        {"name": group.name, "members": member_names(group)}
        for group in reviewer_groups_of(tenant=request.console.tenant)
    ]
    context = {"groups": groups, "refusal": refusal}
    return render(request, "tenants/reviewer_groups.html", context, status=status)


def _act(request: HttpRequest, done: str, action, **kwargs: object) -> HttpResponse:  # noqa: ANN001
    try:
        action(tenant=request.console.tenant, actor=request.console.actor, **kwargs)
    except CairnError as error:
        if error.status == 404:
            raise Http404(error.detail)
        return _page(request, status=error.status, refusal=error.detail)
    messages.success(request, done)
    return redirect("tenants:reviewer_groups")


@require_GET
@console_view(roles.ADMIN)
def groups(request: HttpRequest) -> HttpResponse:
    return _page(request)


@require_POST
@console_view(roles.ADMIN)
def create(request: HttpRequest) -> HttpResponse:
    name = request.POST.get("name", "")[:100].strip()
    return _act(request, f"Reviewer group '{name}' created.", reviewer_group_create, name=name)


@require_POST
@console_view(roles.ADMIN)
def delete(request: HttpRequest, name: str) -> HttpResponse:
    return _act(request, f"Reviewer group '{name}' deleted.", reviewer_group_delete, name=name)


@require_POST
@console_view(roles.ADMIN)
def add_member(request: HttpRequest, name: str) -> HttpResponse:
    username = request.POST.get("username", "")[:150].strip()
    return _act(
        request,
        f"{username} is in '{name}'.",
        reviewer_group_member_add,
        name=name,
        username=username,
    )


@require_POST
@console_view(roles.ADMIN)
def remove_member(request: HttpRequest, name: str, username: str) -> HttpResponse:
    return _act(
        request,
        f"{username} is no longer in '{name}'.",
        reviewer_group_member_remove,
        name=name,
        username=username,
    )
