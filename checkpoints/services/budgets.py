"""Budgets: limits on the run, usage in the envelope. A restore never grants budget."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.utils import timezone

from checkpoints.models import Run

# The largest limit a budget may hold: an integer JSON carries exactly, and a finite cost.
BUDGET_LIMIT_MAX = 10**15

LIMIT_FOR_USED = {
    "attempts_used": "max_attempts",
    "tokens_used": "max_tokens",
    "cost_used": "max_cost",
}


def _deadline(run: Run) -> datetime | None:
    value = run.budget_limits.get("deadline")
    return datetime.fromisoformat(value) if value else None


def budget_remaining(run: Run) -> dict[str, Any]:
    """What is left of each limit (None = unlimited); ``deadline_seconds`` may be negative."""
    used = run.budget_used or {}
    left: dict[str, Any] = {}
    for used_key, limit_key in LIMIT_FOR_USED.items():
        limit = run.budget_limits.get(limit_key)
        name = used_key.removesuffix("_used")
        left[name] = None if limit is None else max(0, limit - used.get(used_key, 0))
    deadline = _deadline(run)
    left["deadline_seconds"] = (
        None if deadline is None else round((deadline - timezone.now()).total_seconds(), 3)
    )
    return left


def budget_exhausted(run: Run) -> str | None:
    """A sentence naming the first exhausted budget, or None while every budget has room."""
    used = run.budget_used or {}
    for used_key, limit_key in LIMIT_FOR_USED.items():
        limit = run.budget_limits.get(limit_key)
        if limit is not None and used.get(used_key, 0) >= limit:
            name = used_key.removesuffix("_used")
            return f"budget exhausted: {name} used {used.get(used_key, 0)} of {limit}"
    deadline = _deadline(run)
    if deadline is not None and timezone.now() >= deadline:
        return f"budget exhausted: the deadline {deadline.isoformat()} has passed"
    return None
