"""Signing in (throttled) and setting a password from an invitation link."""

from __future__ import annotations

import logging
from collections.abc import Callable

from django.contrib.auth import views as auth_views
from django.db import transaction
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.urls import reverse_lazy

from tenants.selectors import tenants_of
from tenants.services import Actor, audit_record
from tenants.throttle import login_failure_record, login_success_record, login_throttle_refusal
from tenants.usernames import same_account_name

log = logging.getLogger("cairn.security")


def client_ip(request: HttpRequest) -> str:
    # REMOTE_ADDR only: a forwarded header is whatever the client wants it to be unless a
    # proxy we trust sets it, and the proxy in front is expected to set REMOTE_ADDR.
    return request.META.get("REMOTE_ADDR") or "unknown"


def throttled_sign_in(request: HttpRequest, sign_in: Callable[[], HttpResponse]) -> HttpResponse:
    """Run the sign-in view ``sign_in`` for ``request`` under the throttle: refused (429,
    saying which limit and when to retry) after too many failures, and each POST counted
    as a failure or a success by whether someone is signed in after it. The console's
    sign-in and Django's admin sign-in (``cairn.admin``) both go through here."""
    if request.method != "POST":
        return sign_in()
    username = str(request.POST.get("username", ""))[:150]
    ip = client_ip(request)
    refusal = login_throttle_refusal(username=username, ip=ip)
    if refusal:
        log.warning(
            "sign-in throttled",
            extra={
                "username": username,
                "ip": ip,
                "limit": "address" if refusal.per_address else "username",
            },
        )
        response = render(
            request,
            "tenants/login_throttled.html",
            {"minutes": max(1, (refusal.seconds + 59) // 60), "per_address": refusal.per_address},
            status=429,
        )
        response["Retry-After"] = str(refusal.seconds)
        return response
    response = sign_in()
    user = getattr(request, "user", None)
    # Signed in by this very POST: the views redirect, and the user is the one named (a
    # session already signed in as someone else proves nothing about this attempt).
    if (
        response.status_code == 302
        and user is not None
        and user.is_authenticated
        and same_account_name(user.get_username(), username)
    ):
        login_success_record(username=user.get_username(), ip=ip)
    else:
        login_failure_record(username=username, ip=ip)
    return response


class SignInView(auth_views.LoginView):
    """Django's login view, refusing attempts for a while after too many failures."""

    template_name = "console/login.html"
    redirect_authenticated_user = True

    def post(self, request: HttpRequest, *args: object, **kwargs: object) -> HttpResponse:
        return throttled_sign_in(
            request, lambda: super(SignInView, self).post(request, *args, **kwargs)
        )


class SetPasswordView(auth_views.PasswordResetConfirmView):
    """The invitation link: choose a password once; the link stops working after."""

    template_name = "tenants/set_password.html"
    success_url = reverse_lazy("tenants:set_password_done")
    post_reset_login = False

    def form_valid(self, form):  # noqa: ANN001, ANN201
        user = form.user
        with transaction.atomic():
            response = super().form_valid(form)
            for tenant in tenants_of(user):
                audit_record(
                    tenant=tenant,
                    actor=Actor(user=user, ip=self.request.META.get("REMOTE_ADDR")),
                    action="member.password_set",
                    target=user.get_username(),
                )
        return response


class SetPasswordDoneView(auth_views.PasswordResetCompleteView):
    template_name = "tenants/set_password_done.html"
