"""Content-Security-Policy: only the app's own scripts and styles, never inline script; and
no NUL character in a query string."""

from __future__ import annotations

from collections.abc import Callable

from django.http import HttpRequest, HttpResponse, HttpResponseBadRequest, JsonResponse

from cairn.errors import is_api
from checkpoints.api.errors import error_body

POLICY = "; ".join(
    [
        "default-src 'self'",
        "script-src 'self'",
        "style-src 'self'",
        "img-src 'self' data:",
        "connect-src 'self'",
        "frame-ancestors 'none'",
        "form-action 'self'",
        "base-uri 'none'",
        "object-src 'none'",
    ]
)


class ContentSecurityPolicyMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]):
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        response = self.get_response(request)
        response.headers.setdefault("Content-Security-Policy", POLICY)
        return response


class RefuseNulMiddleware:
    """A NUL character (``%00``) in the query string is refused with 400 before any view
    reads it: PostgreSQL cannot hold NUL in a text column, so a filter carrying one would
    fail in the database as a 500, and SQLite must answer the same. (Path segments are
    names or ids each view validates, and bodies go through forms and serializers, which
    refuse NUL themselves.)"""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]):
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if any(
            "\x00" in key or any("\x00" in value for value in values)
            for key, values in request.GET.lists()
        ):
            return _refuse_nul(request)
        return self.get_response(request)


def _refuse_nul(request: HttpRequest) -> HttpResponse:
    sentence = "The query string contains a NUL character (%00), which no Cairn page accepts."
    if is_api(request):
        return JsonResponse(error_body("invalid_request", sentence), status=400)
    return HttpResponseBadRequest(sentence, content_type="text/plain; charset=utf-8")
