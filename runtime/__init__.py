"""Cairn's workflow runtime: workflows declared in Python, run step by step on Celery
workers, checkpointed at every step, resumed after any crash from the last accepted
checkpoint. Start with ``runtime.definition.Workflow``.

The authoring names are importable from here (``from runtime import Workflow``). They load
on first use: this package is also a Django app, and Django imports it before the model
registry is ready, while ``StepContext`` needs the store's models.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .context import StepContext
    from .definition import Next, Workflow
    from .errors import PermanentStepError, RetryableStepError

_AUTHORING = {
    "Next": ".definition",
    "Workflow": ".definition",
    "StepContext": ".context",
    "PermanentStepError": ".errors",
    "RetryableStepError": ".errors",
}

__all__ = ["Next", "PermanentStepError", "RetryableStepError", "StepContext", "Workflow"]


def __getattr__(name: str) -> Any:
    if name not in _AUTHORING:
        raise AttributeError(f"module 'runtime' has no attribute {name!r}")
    return getattr(import_module(_AUTHORING[name], __name__), name)
