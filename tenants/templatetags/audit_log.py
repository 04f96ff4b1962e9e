"""Template helpers of the audit log page."""

from __future__ import annotations

from typing import Any

from django import template

from tenants.audit import details_json

register = template.Library()


@register.filter
def compact_json(value: Any) -> str:
    """``{"from":"running"}``, not Python's ``{'from': 'running'}``."""
    return details_json(value)
