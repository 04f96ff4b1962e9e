"""Answering an invitation (the one-time link an admin sends), and a member's own API
tokens. Thin: forms, services, templates.

The link page looks the same whether or not the invited username has an account: it
offers both ways in (sign in and accept, or choose a password), and choosing a password
for a username that has an account answers exactly as for one that has not, so the link
does not tell its holder who has an account either."""

from __future__ import annotations

from uuid import UUID

from django.contrib.auth import get_user_model
from django.contrib.auth.forms import SetPasswordForm
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.urls import reverse
from django.views.decorators.http import require_http_methods

from cairn.errors import CairnError
from tenants.access import console_view
from tenants.forms import TokenForm
from tenants.members import (
    invitation_accept,
    invitation_accept_new,
    invitation_decline,
    invitation_open,
)
from tenants.models import ApiToken
from tenants.services import Actor, token_issue, token_revoke
from tenants.usernames import same_account_name

TEMPLATE = "tenants/invitation.html"


def _actor(request: HttpRequest) -> Actor:
    return Actor(user=request.user, ip=request.META.get("REMOTE_ADDR"))


@require_http_methods(["GET", "POST"])
def invitation(request: HttpRequest, invitation_id: UUID, token: str) -> HttpResponse:
    invite = invitation_open(invitation_id=invitation_id, token=token)
    if invite is None:
        return render(request, TEMPLATE, {"invalid": True})
    user_model = get_user_model()
    mine = request.user.is_authenticated and same_account_name(
        request.user.get_username(), invite.username
    )
    context = {
        "invitation": invite,
        "mine": mine,
        "signed_in_as_other": request.user.is_authenticated and not mine,
        "login_url": f"{reverse('console:login')}?next={request.path}",
    }
    if request.method == "POST" and mine:
        try:
            if request.POST.get("answer") == "accept":
                invitation_accept(invitation=invite, user=request.user, actor=_actor(request))
                return render(request, TEMPLATE, {**context, "answered": "accepted"})
            invitation_decline(invitation=invite, user=request.user, actor=_actor(request))
            return render(request, TEMPLATE, {**context, "answered": "declined"})
        except CairnError as error:
            return render(request, TEMPLATE, {**context, "refusal": error.detail}, status=409)
    form = SetPasswordForm(
        user_model(username=invite.username, email=invite.email),
        request.POST if request.method == "POST" and not mine else None,
    )
    if request.method == "POST" and not mine:
        if not form.is_valid():
            return render(request, TEMPLATE, {**context, "form": form}, status=400)
        # False when the username has an account: nothing changes, and the answer is the
        # same, so this form cannot tell anyone whether an account exists.
        try:
            invitation_accept_new(
                invitation=invite,
                password=form.cleaned_data["new_password1"],
                ip=request.META.get("REMOTE_ADDR"),
            )
        except CairnError as error:  # answered by a racing request meanwhile
            return render(request, TEMPLATE, {**context, "refusal": error.detail}, status=409)
        return render(request, TEMPLATE, {**context, "answered": "password"})
    return render(request, TEMPLATE, {**context, "form": form})


@require_http_methods(["GET", "POST"])
@console_view(None)
def my_tokens(request: HttpRequest) -> HttpResponse:
    """The signed-in member's own API tokens in the current tenant: issue and revoke."""
    access = request.console
    issued = secret = None
    refusal = ""
    status = 200
    if request.method == "POST":
        revoke = request.POST.get("revoke")
        if revoke:
            token = ApiToken.objects.filter(
                tenant=access.tenant, user=request.user, pk=_uuid(revoke)
            ).first()
            if token is None:
                refusal, status = "You have no such token here.", 404
            else:
                token_revoke(token=token, actor=access.actor)
        else:
            form = TokenForm(request.POST)
            if not form.is_valid():
                refusal, status = "A token label has at most 100 characters.", 400
            else:
                try:
                    issued, secret = token_issue(
                        tenant=access.tenant,
                        user=request.user,
                        actor=access.actor,
                        name=form.cleaned_data["name"],
                    )
                except CairnError as error:  # a label that looks like a credential
                    refusal, status = error.detail, error.status
    tokens = ApiToken.objects.filter(tenant=access.tenant, user=request.user).order_by(
        "-created_at"
    )
    response = render(
        request,
        "tenants/tokens.html",
        {"tokens": tokens, "issued": issued, "secret": secret, "refusal": refusal},
        status=status,
    )
    response["Cache-Control"] = "no-store"
    return response


def _uuid(text: str) -> UUID | None:
    try:
        return UUID(str(text))
    except ValueError:
        return None
