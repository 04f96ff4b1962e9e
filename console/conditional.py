"""Polled partials answered with a conditional response: an idle page costs a 304.

The tag is a hash of the rendered body, so it is right whatever the partial shows (times,
counts, badges); the server still renders it, the network carries no body while nothing
changed. ``private, no-cache`` makes the browser keep its copy and revalidate it on every
poll (base.html tells htmx not to swap a bare 304).
"""

from __future__ import annotations

import hashlib

from django.http import HttpRequest, HttpResponse, HttpResponseNotModified
from django.utils.http import parse_etags


def conditional(request: HttpRequest, response: HttpResponse) -> HttpResponse:
    """``response`` with its ETag, or a 304 when the browser already holds that body."""
    etag = f'"{hashlib.blake2b(response.content, digest_size=16).hexdigest()}"'
    if response.status_code == 200 and etag in parse_etags(
        request.headers.get("If-None-Match", "")
    ):
        response = HttpResponseNotModified()
    response["ETag"] = etag
    response["Cache-Control"] = "private, no-cache"
    return response
