"""``GET /metrics``: for a bearer token (CAIRN_METRICS_TOKEN) or an allowed network.

A request with an Authorization header must carry the token (401 otherwise, also from an
allowed network); a request without one must come from CAIRN_METRICS_ALLOWED_NETWORKS
(403 otherwise). REMOTE_ADDR is the only address trusted: a proxy in front must either
present the token or be the allowed network itself.
"""

from __future__ import annotations

import hmac
import ipaddress
import logging

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.views.decorators.http import require_GET

from observability.metrics import CONTENT_TYPE, metrics_text

log = logging.getLogger("cairn.metrics")


def allowed_networks() -> list[ipaddress.IPv4Network | ipaddress.IPv6Network]:
    return [ipaddress.ip_network(n, strict=False) for n in settings.CAIRN_METRICS_ALLOWED_NETWORKS]


def _from_allowed_network(request: HttpRequest) -> bool:
    try:
        address = ipaddress.ip_address(request.META.get("REMOTE_ADDR", ""))
    except ValueError:
        return False
    return any(address in network for network in allowed_networks())


def _token_ok(header: str) -> bool:
    scheme, _, presented = header.partition(" ")
    token = settings.CAIRN_METRICS_TOKEN
    return (
        bool(token)
        and scheme.lower() == "bearer"
        and hmac.compare_digest(presented.strip().encode(), token.encode())
    )


@require_GET
def metrics(request: HttpRequest) -> HttpResponse:
    header = request.headers.get("Authorization", "")
    if header:
        if not _token_ok(header):
            response = HttpResponse("A valid metrics token is required.\n", status=401)
            response["WWW-Authenticate"] = 'Bearer realm="cairn-metrics"'
            return response
    elif not _from_allowed_network(request):
        return HttpResponse(
            "Metrics are served to the allowed networks or with the metrics token.\n",
            status=403,
            content_type="text/plain",
        )
    return HttpResponse(metrics_text(), content_type=CONTENT_TYPE)
