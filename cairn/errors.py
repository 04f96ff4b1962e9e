"""Project error handlers: a sentence, never a stack trace. API paths answer in the API's
error shape; console pages get a page that names nothing internal."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.template import loader
from django.views import defaults

from checkpoints.api.errors import api_server_error, error_body

API_PREFIX = "/api/"


def is_api(request: HttpRequest) -> bool:
    """Whether the request is for the HTTP API, which answers in its JSON error shape."""
    return request.path.startswith(API_PREFIX)


def server_error(request: HttpRequest) -> HttpResponse:
    if is_api(request):
        return api_server_error(request)
    # Rendered without the request: the failure may be the database the header reads.
    return HttpResponse(loader.get_template("500.html").render(), status=500)


def not_found(request: HttpRequest, exception: Exception) -> HttpResponse:
    if is_api(request):
        return JsonResponse(error_body("not_found", "There is no such API address."), status=404)
    return defaults.page_not_found(request, exception)
