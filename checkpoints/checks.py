"""A misconfigured approvals port is reported at start-up, not at the first approval."""

from __future__ import annotations

from django.core.checks import Error, register
from django.core.exceptions import ImproperlyConfigured

from checkpoints.approvals_port import approvals_port


@register()
def approvals_port_check(app_configs, **kwargs):  # noqa: ANN001, ANN003, ANN201
    try:
        approvals_port()
    except ImproperlyConfigured as exc:
        return [
            Error(
                str(exc),
                hint='The project ships CAIRN_APPROVALS_PORT = "approvals.port.port".',
                id="cairn.E102",
            )
        ]
    return []
