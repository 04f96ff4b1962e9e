"""The runs list (filled in next)."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from console.access import console_view
from tenants import roles


@console_view(roles.OPERATE)
def runs(request: HttpRequest) -> HttpResponse:
    return render(request, "console/placeholder.html", {"title": "Runs", "issue": "console"})
