"""Request hygiene in one place: the Content-Security-Policy (only the app's own scripts
and styles, never inline script), chunked request bodies read within the size limit, and
no NUL character in any text a request carries."""

from __future__ import annotations

import json
import logging
import tempfile
from collections.abc import Callable

from django.conf import settings
from django.core.exceptions import BadRequest, PermissionDenied, SuspiciousOperation
from django.core.handlers.wsgi import LimitedStream, WSGIRequest
from django.db import InterfaceError, OperationalError
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse

from api.errors import api_server_error, error_body
from cairn.error_views import is_api

log = logging.getLogger("cairn.http")
METRICS_PATH = "/metrics"
# Raised when the database server is down, refuses the connection or the file cannot be
# opened (SQLite); a query the database rejects is a bug, answered 500.
DATABASE_DOWN = (OperationalError, InterfaceError)
CLIENT_ERRORS = (Http404, PermissionDenied, SuspiciousOperation, BadRequest)

NUL = "\x00"
FORM_TYPES = ("application/x-www-form-urlencoded", "multipart/form-data")
CHUNK_BYTES = 64 * 1024

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


class ApiErrorsMiddleware:
    """An exception no view answered becomes the API's error shape on API addresses and
    ``/metrics``, in every mode: with ``DEBUG`` on (``DJANGO_DEBUG=1``) Django would
    answer with its debug page, settings included. A database that cannot be reached is a
    503 ``database_unavailable`` (nothing was changed; try again), anything else the
    API's 500 ``server_error``. The traceback goes to the log, never to the client. Django's
    own 4xx exceptions (404, 403, bad requests) keep their usual handling."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]):
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        return self.get_response(request)

    def process_exception(self, request: HttpRequest, exception: Exception) -> HttpResponse | None:
        if not (is_api(request) or request.path == METRICS_PATH):
            return None
        if isinstance(exception, CLIENT_ERRORS):
            return None
        if isinstance(exception, DATABASE_DOWN):
            log.error(
                "database unavailable",
                extra={"path": request.path, "error": type(exception).__name__},
            )
            response = JsonResponse(
                error_body(
                    "database_unavailable",
                    "The database cannot be reached right now; nothing was changed. "
                    "Try again in a few seconds.",
                ),
                status=503,
            )
            response["Retry-After"] = "5"
            return response
        log.exception("unhandled error", extra={"path": request.path})
        return api_server_error(request)


class ChunkedBodyMiddleware:
    """A request body sent with ``Transfer-Encoding: chunked`` is read here, streaming, with
    the size limit enforced while reading (413 past it), and handed on as if it had come
    with a Content-Length. Django itself reads a body without Content-Length as empty, so
    without this a chunked artifact upload was stored as 0 bytes the client never sent.

    Only a server that decodes the chunks for the application (gunicorn, and every ASGI
    server) can be read; a WSGI server that does not say so (``wsgi.input_terminated``,
    e.g. Django's runserver) is answered 411 Length Required, never with an empty body. A
    body whose chunks the server cannot decode is a 400, never a 500."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]):
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if "chunked" in request.META.get("HTTP_TRANSFER_ENCODING", "").lower():
            refusal = _read_chunked_body(request)
            if refusal is not None:
                return refusal
        return self.get_response(request)


def _read_chunked_body(request: HttpRequest) -> HttpResponse | None:
    # The largest body any route takes; each parser then applies its own, smaller limit to
    # the length read here exactly as it does to a declared Content-Length.
    limit = max(settings.CAIRN_MAX_REQUEST_BYTES, settings.CAIRN_MAX_ARTIFACT_BYTES)
    if isinstance(request, WSGIRequest):
        if not request.environ.get("wsgi.input_terminated"):
            return _refuse(
                request,
                411,
                "length_required",
                "This server cannot read a chunked request body; send it with a "
                "Content-Length header.",
            )
        source = request.environ["wsgi.input"]
    else:  # ASGI: the server decoded the chunks, Django spooled them
        source = request._stream
    body = tempfile.SpooledTemporaryFile(max_size=settings.FILE_UPLOAD_MAX_MEMORY_SIZE)
    size = 0
    while True:
        try:
            piece = source.read(min(CHUNK_BYTES, limit + 1 - size))
        except Exception as error:  # noqa: BLE001 - whatever the server's decoder raises
            # A chunk size that is not hex, a chunk cut short, a missing terminator: the
            # server's decoder (gunicorn's InvalidChunkSize, NoMoreData, …) raises while
            # the body is read. The body is the client's, so is the error.
            body.close()
            log.info("malformed chunked body", extra={"error": type(error).__name__})
            return _refuse(
                request,
                400,
                "invalid_request",
                "The chunked request body is malformed (a chunk size that is not "
                "hexadecimal, a chunk cut short or a missing terminator); nothing was read.",
            )
        if not piece:
            break
        size += len(piece)
        if size > limit:
            body.close()
            return _refuse(
                request,
                413,
                "payload_too_large",
                f"The request body is larger than the limit of {limit} bytes.",
            )
        body.write(piece)
    body.seek(0)
    request._stream = LimitedStream(body, size)
    request.META["CONTENT_LENGTH"] = str(size)
    return None


class RefuseNulMiddleware:
    """A NUL character is refused with 400 wherever a request carries text: the path
    (``/operations/%00``), the query string, form fields (console forms) and JSON bodies
    (keys and strings, at any depth). PostgreSQL cannot hold NUL in a text or jsonb column,
    so a NUL that reached a lookup or an insert failed in the database as a 500, while
    SQLite stored or compared it: one place keeps both databases answering the same 400
    before any view, form or serializer runs. Artifact bytes (a raw body) are content, not
    text, and are not inspected."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]):
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        where = nul_in_request(request)
        if where:
            return _refuse(
                request,
                400,
                "invalid_request",
                f"{where} contains a NUL character (%00), which no Cairn page accepts.",
            )
        return self.get_response(request)


def nul_in_request(request: HttpRequest) -> str | None:
    """Which part of ``request`` holds a NUL character, as a sentence's subject, or None."""
    if NUL in request.path_info or NUL in request.path:
        return "The address"
    if _any_nul(request.GET.lists()):
        return "The query string"
    content_type = request.content_type or ""
    if content_type == "application/json" or content_type.endswith("+json"):
        if _json_body_has_nul(request):
            return "The request body"
    elif request.method == "POST" and content_type in FORM_TYPES:
        if _any_nul(request.POST.lists()) or any(
            NUL in (upload.name or "") for upload in request.FILES.values()
        ):
            return "A form field"
    return None


def _any_nul(pairs) -> bool:  # noqa: ANN001
    return any(NUL in key or any(NUL in value for value in values) for key, values in pairs)


def _json_body_has_nul(request: HttpRequest) -> bool:
    try:
        declared = int(request.META.get("CONTENT_LENGTH") or 0)
    except ValueError:
        return False
    # Larger bodies are refused by the parser (413) without being read: leave them to it.
    if not 0 < declared <= settings.CAIRN_MAX_REQUEST_BYTES:
        return False
    body = request.body
    # JSON text can carry NUL only as the escape \u0000 (a raw control character is not
    # JSON): without one in the bytes, nothing needs parsing.
    if b"\\u0000" not in body:
        return False
    try:
        value = json.loads(body)
    except (ValueError, RecursionError):
        return False  # the parser names what is wrong with it
    return _value_has_nul(value)


def _value_has_nul(value: object) -> bool:
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if NUL in item:
                return True
        elif isinstance(item, dict):
            if any(NUL in key for key in item):
                return True
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return False


def _refuse(request: HttpRequest, status: int, code: str, sentence: str) -> HttpResponse:
    if is_api(request):
        return JsonResponse(error_body(code, sentence), status=status)
    return HttpResponse(sentence, status=status, content_type="text/plain; charset=utf-8")
