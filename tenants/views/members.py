"""The members page (admins): invite, change role, remove, API tokens, run grants.

Thin: forms, services, templates. A token's secret and an invitation's set-password link
are rendered in the response to the POST that made them and nowhere else (no-store).
"""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth import get_user_model
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET, require_POST

from cairn.errors import CairnError, NotFound
from tenants import roles
from tenants.access import console_view
from tenants.forms import ONE_RUN, GrantForm, InviteForm, RoleForm, TokenForm
from tenants.grants import run_grant_revoke, run_grant_to_member
from tenants.members import invitations_open, member_invite, member_password_link
from tenants.models import ApiToken
from tenants.selectors import tenant_grants, tenant_members
from tenants.services import member_set_role, permissions_of, token_issue, token_revoke

SECTION = "tenants/members.html#members_section"


def _context(request: HttpRequest, **extra: object) -> dict[str, object]:
    tenant = request.console.tenant
    return {
        "members": tenant_members(tenant),
        "grants": list(tenant_grants(tenant)),
        "invitations": invitations_open(tenant),
        "invite_form": extra.pop("invite_form", None) or InviteForm(),
        "grant_form": extra.pop("grant_form", None) or GrantForm(),
        "role_choices": RoleForm.base_fields["role"].choices,
        "me": request.user.pk,
        **extra,
    }


def _page(request: HttpRequest, status: int = 200, **extra: object) -> HttpResponse:
    template = SECTION if request.htmx else "tenants/members.html"
    response = render(request, template, _context(request, **extra), status=status)
    response["Cache-Control"] = "no-store"
    return response


def _member(request: HttpRequest, user_id: int):  # noqa: ANN202
    """A member (or run-grant holder) of the current tenant; anyone else is a 404."""
    user = get_user_model().objects.filter(pk=user_id).first()
    if user is None or not permissions_of(user=user, tenant=request.console.tenant):
        raise Http404("No such member in this tenant.")
    return user


def _refused(request: HttpRequest, error: CairnError) -> HttpResponse:
    """The refusal inside the members section, which is what an htmx request swaps (it
    swaps 400, 409, 422 and 429 like a 200), with every member's actual role again."""
    if error.status == 404:
        raise Http404(error.detail)
    return _page(request, status=error.status, refusal=error.detail)


@require_GET
@console_view(roles.ADMIN)
def members(request: HttpRequest) -> HttpResponse:
    return _page(request)


@require_POST
@console_view(roles.ADMIN)
def invite(request: HttpRequest) -> HttpResponse:
    form = InviteForm(request.POST)
    if not form.is_valid():
        return _page(request, status=400, invite_form=form)
    data = form.cleaned_data
    one_run = data["role"] == ONE_RUN
    try:
        invitation = member_invite(
            tenant=request.console.tenant,
            username=data["username"],
            email=data["email"],
            role=None if one_run else data["role"],
            run_id=data["run"] if one_run else None,
            actor=request.console.actor,
        )
    except CairnError as error:
        field = "run" if error.status == 404 else next(iter(error.fields or {}), None)
        if field in form.fields:
            form.add_error(field, error.detail)
            return _page(request, status=400, invite_form=form)
        # Next to the form it refuses (an invitation is a whole-page post).
        form.add_error(None, error.detail)
        return _page(request, status=error.status, invite_form=form)
    # The same answer whether or not the username has an account anywhere.
    link = request.build_absolute_uri(invitation.link_path)
    return _page(request, invited=invitation.username, invite_link=link)


@require_POST
@console_view(roles.ADMIN)
def set_role(request: HttpRequest, user_id: int) -> HttpResponse:
    user = _member(request, user_id)
    form = RoleForm(request.POST)
    if not form.is_valid():
        return _page(request, status=400, refusal="Choose one of the roles.")
    try:
        member_set_role(
            tenant=request.console.tenant,
            user=user,
            role=form.cleaned_data["role"],
            actor=request.console.actor,
        )
    except CairnError as error:
        return _refused(request, error)
    return _done(request, f"{user.get_username()} is now {form.cleaned_data['role']}.")


@require_POST
@console_view(roles.ADMIN)
def remove(request: HttpRequest, user_id: int) -> HttpResponse:
    user = _member(request, user_id)
    try:
        member_set_role(
            tenant=request.console.tenant, user=user, role=None, actor=request.console.actor
        )
    except CairnError as error:
        return _refused(request, error)
    return _done(
        request,
        f"{user.get_username()} was removed; their API tokens and run grants stopped working.",
    )


@require_POST
@console_view(roles.ADMIN)
def password_link(request: HttpRequest, user_id: int) -> HttpResponse:
    user = _member(request, user_id)
    try:
        path = member_password_link(
            tenant=request.console.tenant, user=user, actor=request.console.actor
        )
    except CairnError as error:
        return _refused(request, error)
    return _page(request, invited=user.get_username(), invite_link=request.build_absolute_uri(path))


@require_POST
@console_view(roles.ADMIN)
def issue_token(request: HttpRequest, user_id: int) -> HttpResponse:
    user = _member(request, user_id)
    form = TokenForm(request.POST)
    if not form.is_valid():
        return _page(request, status=400, refusal="A token label has at most 100 characters.")
    try:
        token, secret = token_issue(
            tenant=request.console.tenant,
            user=user,
            actor=request.console.actor,
            name=form.cleaned_data["name"],
        )
    except CairnError as error:
        return _refused(request, error)
    return _page(request, issued=token, secret=secret)


@require_POST
@console_view(roles.ADMIN)
def revoke_token(request: HttpRequest, token_id: object) -> HttpResponse:
    token = (
        ApiToken.objects.filter(tenant=request.console.tenant, pk=token_id)
        .select_related("user", "tenant")
        .first()
    )
    if token is None:
        raise Http404("No such token in this tenant.")
    token_revoke(token=token, actor=request.console.actor)
    return _done(request, f"Token {token.prefix}… of {token.user.get_username()} is revoked.")


@require_POST
@console_view(roles.ADMIN)
def grant(request: HttpRequest) -> HttpResponse:
    form = GrantForm(request.POST)
    if not form.is_valid():
        return _page(request, status=400, grant_form=form)
    try:
        granted = run_grant_to_member(
            tenant=request.console.tenant,
            run_id=form.cleaned_data["run"],
            username=form.cleaned_data["username"],
            actor=request.console.actor,
        )
    except NotFound as error:
        form.add_error(next(iter(error.fields or {}), "run"), error.detail)
        return _page(request, status=400, grant_form=form)
    return _done(request, f"{granted.user.get_username()} may now review that run's approvals.")


@require_POST
@console_view(roles.ADMIN)
def revoke_grant(request: HttpRequest, grant_id: object) -> HttpResponse:
    try:
        run_grant_revoke(
            tenant=request.console.tenant, grant_id=grant_id, actor=request.console.actor
        )
    except NotFound as error:
        raise Http404(error.detail)
    return _done(request, "The run grant is withdrawn.")


def _done(request: HttpRequest, notice: str) -> HttpResponse:
    if request.htmx:
        return _page(request, notice=notice)
    messages.success(request, notice)
    return redirect("tenants:members")
