"""Cursor pagination for every API list: ``{"next", "previous", "results"}``, ``limit`` up
to 500. A cursor is opaque; one this API did not issue is bad input (400), never a 404 or a
server error."""

from __future__ import annotations

from django.core.exceptions import ValidationError as DjangoValidationError
from rest_framework.exceptions import NotFound, ValidationError
from rest_framework.pagination import CursorPagination
from rest_framework.request import Request

NOT_OURS = {"cursor": "Not a cursor this API issued; follow `next`."}


class Pagination(CursorPagination):
    page_size = 50
    max_page_size = 500
    page_size_query_param = "limit"
    ordering = ("-created_at", "-id")

    def decode_cursor(self, request: Request):  # noqa: ANN201
        try:
            return super().decode_cursor(request)
        except NotFound:  # DRF's answer to a cursor it cannot decode
            raise ValidationError(NOT_OURS)

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
