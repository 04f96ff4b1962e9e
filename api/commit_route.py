"""A runner's commit (``POST /runs/{id}/checkpoints``) on a short path, without DRF's
request machinery: the route every runner in another language calls once a step, where
DRF's request, negotiation, authentication, permission, serializer and rendering cost more
than the commit's own Python (docs/performance.md, "The HTTP commit, by layer").

The short path answers only the plain case: a bearer token whose member holds the view's
permission, on a run of its tenant, a JSON body of declared length within the limits,
which the commit serializer would accept as it stands, and a client that takes JSON.
Anything else returns None and DRF's view answers it, with its own refusal: the documented
contract stays DRF's by construction. The rules the short path applies are the same
functions DRF's path calls (``bearer_secret``, ``token_authenticate``'s ``token_digest``
and ``token_accept``, ``view_allows``, ``json_body``), and the body's are read from the
serializer's own fields; ``tests/test_commit_route.py`` holds that what it accepts, the
serializer accepts as the same values. The token and the run's head are read in one
statement (``runner_read``), the head only in the token's own tenant. A refusal from the
commit itself is rendered by ``api.errors.refusal``, as DRF's exception handler renders it.
"""

from __future__ import annotations

import re
from typing import Any
from uuid import UUID

import orjson
from django.conf import settings
from django.http import HttpRequest, HttpResponse
from rest_framework import serializers
from rest_framework.exceptions import APIException
from rest_framework.fields import empty

from api.errors import refusal
from api.negotiation import BlankAcceptIsAny
from api.parsers import json_body
from api.serializers import CheckpointCommitSerializer, CommitResultSerializer
from checkpoints.services.checkpoints import checkpoint_commit_by_runner
from checkpoints.services.reads import RunnerRead, runner_read
from tenants.authentication import bearer_secret
from tenants.permissions import view_allows
from tenants.services import Actor

# The media ranges of an Accept header that take the answer's JSON (DRF negotiates the rest).
_JSON_RANGES = frozenset({"application/json", "application/*", "*/*"})
_SURROGATE = re.compile("[\ud800-\udfff]")
_FIELDS = dict(CheckpointCommitSerializer._declared_fields)
_ANSWER_FIELDS = tuple(CommitResultSerializer._declared_fields)
_NEGOTIATION = BlankAcceptIsAny()  # DRF's views read the Accept header through it too


def commit_answer(view: Any, request: HttpRequest, *, run_id: UUID) -> HttpResponse | None:
    """The commit's answer when ``request`` is the plain case, else None (DRF's view
    answers). Raises what the commit raises that is not a refusal, as DRF's view does."""
    # The request's shape first (no statement), so a request DRF will answer anyway does
    # not pay for the token's statement twice.
    if not _plain_request(request):
        return None
    read = _permitted_read(view, request, run_id)
    if read is None or read.head is None:
        return None  # DRF's view refuses it (401, 403, 404), in its own words
    body = _plain_body(request)
    if body is None:
        return None
    token = read.token
    # What DRF's authentication leaves on the request, for whatever reads it afterwards.
    request.user, request.cairn_tenant = token.user, token.tenant
    request.cairn_permissions = token.permissions
    actor = Actor(user=token.user, ip=request.META.get("REMOTE_ADDR"), token_id=token.pk)
    try:
        result = checkpoint_commit_by_runner(
            tenant=token.tenant, run_id=run_id, actor=actor, head=read.head, **body
        )
    except Exception as exc:
        refused = refusal(exc)
        if refused is None:
            raise
        status, answer, headers = refused
        return _json(view, status, answer, headers)
    # The answer's fields are the documented ones (the schema's serializer), read from it.
    answer = {name: getattr(result, name) for name in _ANSWER_FIELDS}
    return _json(view, 201, answer, {})


def commit_body(value: object) -> dict[str, Any] | None:
    """What ``CheckpointCommitSerializer`` validates ``value`` to, when it plainly accepts
    it: every field of its JSON type, within its limits, with nothing to trim or coerce;
    the serializer's defaults for the fields left out. None for anything else."""
    if not isinstance(value, dict) or not value.keys() <= _FIELDS.keys():
        return None
    body: dict[str, Any] = {}
    for name, field in _FIELDS.items():
        if name not in value:
            if field.required:
                return None
            if field.default is not empty:
                body[name] = field.default
            continue
        item = value[name]
        if not _plain(field, item):
            return None
        body[name] = dict(item) if isinstance(item, dict) else item
    return body


def _plain(field: serializers.Field, item: object) -> bool:
    if isinstance(field, serializers.ChoiceField):
        return isinstance(item, str) and item in field.choices
    if isinstance(field, serializers.CharField):
        return (
            isinstance(item, str)
            and (item != "" or field.allow_blank)
            and item == item.strip()
            and (field.max_length is None or len(item) <= field.max_length)
            and (field.min_length is None or len(item) >= field.min_length)
            and "\x00" not in item
            and not _SURROGATE.search(item)
        )
    if isinstance(field, serializers.IntegerField):
        return (
            type(item) is int
            and (field.min_value is None or item >= field.min_value)
            and (field.max_value is None or item <= field.max_value)
        )
    if isinstance(field, serializers.DictField):
        return type(item) is dict and type(field.child).__name__ == "_UnvalidatedField"
    return False  # a field of a kind this path does not know: DRF decides


def _permitted_read(view: Any, request: HttpRequest, run_id: UUID) -> RunnerRead | None:
    """The bearer token, when its member holds the view's permission, with the run's head
    in its tenant: one statement (``runner_read``)."""
    header = request.META.get("HTTP_AUTHORIZATION", "")
    try:
        secret = bearer_secret(header.encode("iso-8859-1"))
    except (APIException, UnicodeEncodeError):
        return None
    if secret is None:
        return None
    read = runner_read(secret=secret, run_id=run_id)
    if read is None or not view_allows(view, request.method, read.token.permissions):
        return None
    return read


def _plain_request(request: HttpRequest) -> bool:
    """JSON in, of a declared length within the limit, no query, a client that takes JSON."""
    if request.META.get("QUERY_STRING") or request.content_type != "application/json":
        return False
    if request.content_params.get("charset", "utf-8").lower() not in ("utf-8", "utf8"):
        return False
    if not _takes_json(request):
        return False
    try:
        declared = int(request.META.get("CONTENT_LENGTH") or "")
    except ValueError:
        return False
    return 0 < declared <= settings.CAIRN_MAX_REQUEST_BYTES


def _plain_body(request: HttpRequest) -> dict[str, Any] | None:
    try:
        value = json_body(request.body)  # kept on the request: DRF's view can read it again
    except APIException:
        return None
    return commit_body(value)


def _takes_json(request: HttpRequest) -> bool:
    """Whether the client takes JSON: its Accept header's ranges, as the API's negotiation
    reads them (none is no preference), include it. A range with parameters (quality
    values) is left to DRF's negotiation."""
    ranges = _NEGOTIATION.get_accept_list(request)
    if any(";" in media for media in ranges):
        return False
    return any(media in _JSON_RANGES for media in ranges)


def _json(view: Any, status: int, body: dict, headers: dict[str, str]) -> HttpResponse:
    response = HttpResponse(orjson.dumps(body), status=status, content_type="application/json")
    for name, value in {**view.default_response_headers, **headers}.items():
        response[name] = value
    return response
