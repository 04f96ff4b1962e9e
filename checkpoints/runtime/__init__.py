"""Cairn's workflow runtime: workflows declared in Python, run step by step on Celery
workers, checkpointed at every step, resumed after any crash from the last accepted
checkpoint. Start with ``checkpoints.runtime.definition.Workflow``."""

from .context import StepContext
from .definition import Next, Workflow
from .errors import PermanentStepError, RetryableStepError

__all__ = ["Next", "PermanentStepError", "RetryableStepError", "StepContext", "Workflow"]
