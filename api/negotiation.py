"""How the API reads a request's Accept header (DRF's content negotiation, one rule).

The API answers JSON. A header that names no usable media type (empty, only blanks and
commas, or nothing left once DRF drops over-long parts) is no preference, as if the client
had sent none: RFC 9110 (12.5.1) lets a server disregard the field, and DRF's default
answered such a client 406, which no operation documents. A header that names media types
none of which is JSON is still refused with the documented 406 (``api.schema``). The
commit's short path (``api.commit_route``) reads the header through the same class, so both
paths see the same media ranges.
"""

from __future__ import annotations

from typing import Any

from rest_framework.negotiation import DefaultContentNegotiation


class BlankAcceptIsAny(DefaultContentNegotiation):
    def get_accept_list(self, request: Any) -> list[str]:
        """The header's media ranges as DRF reads them (its length limits applied); none
        is no preference."""
        return super().get_accept_list(request) or ["*/*"]
