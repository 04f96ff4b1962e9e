"""Django's admin site with its sign-in throttled like the console's: ``/admin/login/``
was a way around the throttle (``tenants.views.auth.throttled_sign_in``)."""

from __future__ import annotations

from django.contrib import admin
from django.contrib.admin.apps import AdminConfig
from django.http import HttpRequest, HttpResponse


class CairnAdminSite(admin.AdminSite):
    def login(self, request: HttpRequest, extra_context: dict | None = None) -> HttpResponse:
        # Imported here: this module is loaded with the app registry, before models are.
        from tenants.views.auth import throttled_sign_in

        return throttled_sign_in(
            request, lambda: super(CairnAdminSite, self).login(request, extra_context)
        )


class CairnAdminConfig(AdminConfig):
    default_site = "cairn.admin.CairnAdminSite"
