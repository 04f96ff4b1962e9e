"""Project error handlers: a sentence, never a stack trace. API paths answer in the API's
error shape; console pages get a page that names nothing internal."""

from __future__ import annotations

import re
import uuid

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.template import loader
from django.views import defaults

from api.errors import api_server_error, error_body

API_PREFIX = "/api/"


def is_api(request: HttpRequest) -> bool:
    """Whether the request is for the HTTP API, which answers in its JSON error shape."""
    return request.path.startswith(API_PREFIX)


def server_error(request: HttpRequest) -> HttpResponse:
    if is_api(request):
        return api_server_error(request)
    # Rendered without the request: the failure may be the database the header reads.
    return HttpResponse(loader.get_template("500.html").render(), status=500)


RUN_PATH = re.compile(r"^/runs/([0-9a-f-]{36})/")


def not_found(request: HttpRequest, exception: Exception) -> HttpResponse:
    if is_api(request):
        return JsonResponse(error_body("not_found", "There is no such API address."), status=404)
    other = _run_in_another_tenant(request)
    if other is not None:
        html = loader.render_to_string(
            "404.html", {"other_tenant": other, "next_path": request.path}, request=request
        )
        return HttpResponse(html, status=404)
    return defaults.page_not_found(request, exception)


def _run_in_another_tenant(request: HttpRequest) -> object | None:
    """The other tenant of the signed-in user whose run a console URL names, when the user
    may open runs there: the 404 then says where the run is. Nobody learns of a run in a
    tenant they do not belong to."""
    from checkpoints.models import Run
    from tenants import roles
    from tenants.selectors import request_tenant, tenants_of
    from tenants.services import permissions_of

    match = RUN_PATH.match(request.path)
    user = getattr(request, "user", None)
    if match is None or user is None or not user.is_authenticated:
        return None
    try:
        run_id = uuid.UUID(match.group(1))
    except ValueError:
        return None
    current = request_tenant(request)
    tenant_id = Run.objects.filter(pk=run_id).values_list("tenant_id", flat=True).first()
    if tenant_id is None or (current is not None and tenant_id == current.pk):
        return None
    tenant = tenants_of(user).filter(pk=tenant_id).first()
    if tenant is None or roles.OPERATE not in permissions_of(user=user, tenant=tenant):
        return None
    return tenant
