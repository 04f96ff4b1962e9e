"""Misconfigured observability settings are reported at start-up, not at the first scrape
or the first run page: the metrics network list and the trace link's template."""

from __future__ import annotations

import ipaddress

from django.conf import settings
from django.core.checks import Error, register


@register()
def metrics_networks_check(app_configs, **kwargs):  # noqa: ANN001, ANN003, ANN201
    errors = []
    for network in settings.CAIRN_METRICS_ALLOWED_NETWORKS:
        try:
            ipaddress.ip_network(network, strict=False)
        except ValueError:
            errors.append(
                Error(
                    f"CAIRN_METRICS_ALLOWED_NETWORKS holds '{network}', which is not a network.",
                    hint="Use a comma-separated list of CIDR blocks such as 10.0.0.0/8.",
                    id="cairn.E101",
                )
            )
    return errors


@register()
def trace_url_template_check(app_configs, **kwargs):  # noqa: ANN001, ANN003, ANN201
    template = settings.CAIRN_TRACE_URL_TEMPLATE
    if not template:
        return []
    if not template.startswith(("https://", "http://")) or "{trace_id}" not in template:
        return [
            Error(
                "CAIRN_TRACE_URL_TEMPLATE must be an http(s) URL containing {trace_id}.",
                hint="For example http://jaeger:16686/trace/{trace_id}.",
                id="cairn.E102",
            )
        ]
    return []
