"""Cursor pagination for every API list: ``{"next", "previous", "results"}``, ``limit`` up
to 500. A cursor is opaque; one this API did not issue is bad input (400), never a 404 or a
server error.

Cursors are signed (``DJANGO_SECRET_KEY``, its own salt): DRF's own decoder reads any text
that base64 ignores (``%%%``, an empty cursor) as "the first page", so without a signature
a cursor the API never issued would be silently ignored."""

from __future__ import annotations

from base64 import b64decode, b64encode
from urllib import parse

from django.core import signing
from django.core.exceptions import ValidationError as DjangoValidationError
from rest_framework.exceptions import NotFound, ValidationError
from rest_framework.pagination import Cursor, CursorPagination, _positive_int
from rest_framework.request import Request
from rest_framework.utils.urls import replace_query_param

NOT_OURS = {"cursor": "Not a cursor this API issued; follow `next`."}
_SIGNER = signing.Signer(salt="cairn.api.cursor")


class Pagination(CursorPagination):
    page_size = 50
    max_page_size = 500
    page_size_query_param = "limit"
    ordering = ("-created_at", "-id")

    def encode_cursor(self, cursor: Cursor) -> str:
        tokens = {}
        if cursor.offset != 0:
            tokens["o"] = str(cursor.offset)
        if cursor.reverse:
            tokens["r"] = "1"
        if cursor.position is not None:
            tokens["p"] = cursor.position
        encoded = b64encode(parse.urlencode(tokens).encode("ascii")).decode("ascii")
        return replace_query_param(self.base_url, self.cursor_query_param, _SIGNER.sign(encoded))

    def decode_cursor(self, request: Request) -> Cursor | None:
        given = request.query_params.get(self.cursor_query_param)
        if given is None:
            return None
        try:
            querystring = b64decode(_SIGNER.unsign(given), validate=True).decode("ascii")
            tokens = parse.parse_qs(querystring, keep_blank_values=True, strict_parsing=False)
            offset = _positive_int(tokens.get("o", ["0"])[0], cutoff=self.offset_cutoff)
            reverse = bool(int(tokens.get("r", ["0"])[0]))
            position = tokens.get("p", [None])[0]
        except (signing.BadSignature, TypeError, ValueError, NotFound):
            raise ValidationError(NOT_OURS)
        return Cursor(offset=offset, reverse=reverse, position=position)

    def get_page_size(self, request: Request) -> int:
        """``?limit=`` is a whole number from 1 to 500, or a 400 (docs/api.md): ``null``,
        ``true``, ``-18882`` or ``text`` were silently read as the default."""
        given = request.query_params.get(self.page_size_query_param)
        if given is None:
            return self.page_size
        if not (given.isascii() and given.isdigit() and 1 <= int(given) <= self.max_page_size):
            raise ValidationError(
                {self.page_size_query_param: f"a whole number from 1 to {self.max_page_size}"}
            )
        return int(given)

    def get_schema_operation_parameters(self, view):  # noqa: ANN001, ANN201
        parameters = super().get_schema_operation_parameters(view)
        for parameter in parameters:
            if parameter["name"] == self.page_size_query_param:
                parameter["schema"] = {
                    "type": "integer",
                    "minimum": 1,
                    "maximum": self.max_page_size,
                    "default": self.page_size,
                }
        return parameters

    def paginate_queryset(self, queryset, request, view=None):  # noqa: ANN001, ANN201
        # A decodable cursor whose position is not a value of the ordering column (made by
        # hand) fails when the page is read: that is the caller's error too.
        try:
            return super().paginate_queryset(queryset, request, view)
        except (DjangoValidationError, ValueError, TypeError):
            if request.query_params.get(self.cursor_query_param):
                raise ValidationError(NOT_OURS)
            raise


class OldestFirst(Pagination):
    """A run's checkpoints, by sequence."""

    ordering = ("sequence",)


class CreatedFirst(Pagination):
    ordering = ("created_at", "id")
