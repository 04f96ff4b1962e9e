"""A misconfigured metrics network list is reported at start-up, not at the first scrape."""

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
