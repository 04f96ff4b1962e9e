"""What a step raises to say how it failed."""

from __future__ import annotations


class StepError(Exception):
    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class RetryableStepError(StepError):
    """Try again later: the run waits in ``waiting_retry`` until ``delay_seconds`` have passed
    (default ``CAIRN_RETRY_DELAY_SECONDS``). The failed try used one attempt."""

    def __init__(self, reason: str, *, delay_seconds: float | None = None) -> None:
        super().__init__(reason)
        self.delay_seconds = delay_seconds


class PermanentStepError(StepError):
    """Trying again cannot help: the run fails with this reason."""


class BudgetExhaustedError(PermanentStepError):
    """A model call would exceed the run's token or cost budget."""


class LeaseLost(Exception):
    """Another worker owns the run now (or the run moved on): this worker must stop and
    discard whatever it has not committed."""
