"""The health page (filled in next)."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from console.access import console_view
from tenants import roles


@console_view(roles.ADMIN)
def health(request: HttpRequest) -> HttpResponse:
    return render(request, "console/placeholder.html", {"title": "Health", "issue": "console"})
