"""One error shape for the whole API: {"code", "detail", "fields"?}. Never a stack trace."""

from __future__ import annotations

import logging

from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.core.exceptions import RequestDataTooBig
from django.http import Http404, JsonResponse
from rest_framework import exceptions
from rest_framework.response import Response

from cairn.errors import CairnError
from checkpoints import crypto

log = logging.getLogger("cairn.api")

_DRF_CODES = {
    exceptions.ParseError: "invalid_request",
    exceptions.ValidationError: "invalid_request",
    exceptions.AuthenticationFailed: "not_authenticated",
    exceptions.NotAuthenticated: "not_authenticated",
    exceptions.PermissionDenied: "permission_denied",
    exceptions.NotFound: "not_found",
    exceptions.MethodNotAllowed: "method_not_allowed",
    exceptions.NotAcceptable: "not_acceptable",
    exceptions.UnsupportedMediaType: "unsupported_media_type",
    exceptions.Throttled: "throttled",
}


def error_body(code: str, detail: str, fields: dict | None = None) -> dict:
    body = {"code": code, "detail": detail}
    if fields:
        body["fields"] = fields
    return body


def _flatten(detail, prefix: str = "") -> dict[str, str]:  # noqa: ANN001
    if isinstance(detail, dict):
        out: dict[str, str] = {}
        for key, value in detail.items():
            out.update(_flatten(value, f"{prefix}{key}." if key != "non_field_errors" else prefix))
        return out
    if isinstance(detail, list):
        if detail and all(not isinstance(d, dict | list) for d in detail):
            return {prefix.rstrip(".") or "body": " ".join(str(d) for d in detail)}
        out = {}
        for index, value in enumerate(detail):
            out.update(_flatten(value, f"{prefix}{index}."))
        return out
    return {prefix.rstrip(".") or "body": str(detail)}


def refusal(exc: Exception) -> tuple[int, dict, dict[str, str]] | None:
    """The API's answer to what a service raised (its status, body and headers), or None for
    an exception that is not a refusal. Both the DRF views (``exception_handler``) and the
    commit's short path (``api.commit_route``) answer with it."""
    if isinstance(exc, CairnError):
        headers = {} if exc.retry_after is None else {"Retry-After": str(exc.retry_after)}
        return exc.status, error_body(exc.code, exc.detail, exc.fields), headers
    if isinstance(exc, RequestDataTooBig):
        return 413, error_body("payload_too_large", "The request body is too large."), {}
    if isinstance(exc, crypto.MissingKeyError):
        log.error("missing encryption key", extra={"key_id": exc.key_id})
        return 503, error_body("key_unavailable", str(exc)), {}
    return None


def exception_handler(exc, context):  # noqa: ANN001, ANN201
    refused = refusal(exc)
    if refused is not None:
        status, body, headers = refused
        return Response(body, status=status, headers=headers)
    if isinstance(exc, Http404):
        exc = exceptions.NotFound("Not found.")
    elif isinstance(exc, DjangoPermissionDenied):
        exc = exceptions.PermissionDenied()
    if isinstance(exc, exceptions.APIException):
        code = next((c for cls, c in _DRF_CODES.items() if isinstance(exc, cls)), "error")
        if isinstance(exc, exceptions.ValidationError):
            fields = _flatten(exc.detail)
            response = Response(
                error_body(
                    code,
                    "The request is not valid: "
                    + "; ".join(f"{k}: {v}" for k, v in list(fields.items())[:5]),
                    fields,
                ),
                status=400,
            )
        else:
            detail = exc.detail if isinstance(exc.detail, str) else str(exc.detail)
            response = Response(error_body(code, str(detail)), status=exc.status_code)
        if getattr(exc, "auth_header", None):
            response["WWW-Authenticate"] = exc.auth_header
        if getattr(exc, "wait", None):
            response["Retry-After"] = str(int(exc.wait))
        return response
    return None


def api_server_error(request, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN201
    """handler500 for API paths: a JSON sentence, never a trace."""
    return JsonResponse(
        error_body("server_error", "Something went wrong on our side; nothing was changed."),
        status=500,
    )
