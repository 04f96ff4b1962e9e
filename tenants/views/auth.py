"""Signing in (throttled) and setting a password from an invitation link."""

from __future__ import annotations

import logging

from django.contrib.auth import views as auth_views
from django.db import transaction
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.urls import reverse_lazy

from tenants.selectors import tenants_of
from tenants.services import Actor, audit_record
from tenants.throttle import login_failure_record, login_success_record, login_throttle_refusal

log = logging.getLogger("cairn.security")


def client_ip(request: HttpRequest) -> str:
    # REMOTE_ADDR only: a forwarded header is whatever the client wants it to be unless a
    # proxy we trust sets it, and the proxy in front is expected to set REMOTE_ADDR.
    return request.META.get("REMOTE_ADDR") or "unknown"


class SignInView(auth_views.LoginView):
    """Django's login view, refusing attempts for a while after too many failures."""

    template_name = "console/login.html"
    redirect_authenticated_user = True

    def post(self, request: HttpRequest, *args: object, **kwargs: object) -> HttpResponse:
        username = str(request.POST.get("username", ""))[:150]
        refusal = login_throttle_refusal(username=username, ip=client_ip(request))
        if refusal:
            log.warning(
                "sign-in throttled",
                extra={
                    "username": username,
                    "ip": client_ip(request),
                    "limit": "address" if refusal.per_address else "username",
                },
            )
            response = render(
                request,
                "tenants/login_throttled.html",
                {
                    "minutes": max(1, (refusal.seconds + 59) // 60),
                    "per_address": refusal.per_address,
                },
                status=429,
            )
            response["Retry-After"] = str(refusal.seconds)
            return response
        return super().post(request, *args, **kwargs)

    def form_invalid(self, form):  # noqa: ANN001, ANN201
        username = str(self.request.POST.get("username", ""))[:150]
        login_failure_record(username=username, ip=client_ip(self.request))
        return super().form_invalid(form)

    def form_valid(self, form):  # noqa: ANN001, ANN201
        login_success_record(username=form.get_user().get_username(), ip=client_ip(self.request))
        return super().form_valid(form)


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
