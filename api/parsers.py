"""A JSON parser that refuses bodies over CAIRN_MAX_REQUEST_BYTES before reading them whole,
and JSON that Cairn cannot store and hash exactly (``envelope.json_problem``)."""

from __future__ import annotations

import json
from typing import Any

from django.conf import settings
from rest_framework.exceptions import ParseError
from rest_framework.parsers import BaseParser

from cairn.errors import PayloadTooLarge
from checkpoints.envelope import json_problem


def _reject_constant(name: str):  # noqa: ANN202
    raise ValueError(f"{name} is not valid JSON")


def read_limited(stream, limit: int, declared: int | None = None) -> bytes:  # noqa: ANN001
    if declared is not None and declared > limit:
        raise PayloadTooLarge(f"The request body is {declared} bytes; the limit is {limit}.")
    data = stream.read(limit + 1) if stream is not None else b""
    if len(data) > limit:
        raise PayloadTooLarge(f"The request body is larger than the limit of {limit} bytes.")
    return data


class LimitedJSONParser(BaseParser):
    media_type = "application/json"

    def parse(self, stream, media_type=None, parser_context=None):  # noqa: ANN001, ANN201
        request = (parser_context or {}).get("request")
        declared = None
        if request is not None:
            try:
                declared = int(request.META.get("CONTENT_LENGTH") or 0) or None
            except ValueError:
                declared = None
        return json_body(read_limited(stream, settings.CAIRN_MAX_REQUEST_BYTES, declared))


def json_body(data: bytes) -> Any:
    """The body's JSON value, or ParseError saying why it is not one Cairn can store.

    The standard library's decoder, not orjson: orjson reads an integer beyond 64 bits as a
    float, which ``json_problem`` would then accept as a different number."""
    try:
        value = json.loads(data.decode("utf-8"), parse_constant=_reject_constant)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ParseError(f"The body is not valid JSON: {exc}")
    except RecursionError:
        raise ParseError("The body is not valid JSON: it is nested too deeply.")
    problem = json_problem(value, where="the body")
    if problem:
        raise ParseError(f"The body cannot be stored as JSON: {problem}.")
    return value
