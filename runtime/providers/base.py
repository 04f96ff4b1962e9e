"""The provider interface: ``perform`` with an idempotency key, ``lookup`` by key or client
reference, and one result type whose outcome says exactly what is known."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol


class Outcome(StrEnum):
    # Done: the provider names its operation id (and a result).
    CONFIRMED = "confirmed"
    # Definitively not done and never will be: the provider refused the request.
    FAILED = "failed"
    # Lookup only: the provider has no record of this key (so it did not perform it).
    NOT_FOUND = "not_found"
    # The provider could not be reached. For perform: nothing was sent. For lookup: ask later.
    UNAVAILABLE = "unavailable"
    # It may or may not have happened: a timeout, a dropped response, a server error, or a
    # provider that cannot look operations up.
    UNKNOWN = "unknown"
    # Long-running tools only: the provider accepted the job and is still working on it.
    RUNNING = "running"


@dataclass(frozen=True)
class EffectRequest:
    """What a step intends: an action on a target with a JSON payload (no secrets in it)."""

    action: str
    target: str
    payload: dict[str, Any] = field(default_factory=dict)
    client_reference: str = ""


@dataclass(frozen=True)
class ProviderResult:
    outcome: Outcome
    provider_operation_id: str = ""
    result: dict[str, Any] = field(default_factory=dict)
    reason: str = ""
    job_id: str = ""  # long-running tools: the provider's job id (submit, job_status)

    @classmethod
    def confirmed(cls, provider_operation_id: str, result: dict[str, Any]) -> ProviderResult:
        return cls(Outcome.CONFIRMED, provider_operation_id=provider_operation_id, result=result)


class Provider(Protocol):
    """An adapter for one external system. Both calls must be safe to repeat: ``perform``
    with the same key must never produce a second effect at a provider that honours keys,
    and ``lookup`` only reads. Neither raises for a provider's answer: every answer maps to
    an Outcome, with a sentence in ``reason`` when it is not CONFIRMED."""

    name: str

    def perform(self, *, key: str, request: EffectRequest) -> ProviderResult: ...

    def lookup(self, *, key: str, client_reference: str = "") -> ProviderResult: ...


class JobProvider(Provider, Protocol):
    """An adapter for a long-running tool: ``submit`` starts a job under the idempotency key
    and answers RUNNING with its ``job_id`` (or FAILED / UNAVAILABLE / UNKNOWN, as perform
    does); ``job_status`` only reads: RUNNING, CONFIRMED (done: id and result), FAILED,
    NOT_FOUND, UNAVAILABLE or UNKNOWN. The job id is recorded before the first poll, so a
    restore observes the same job and never submits again."""

    def submit(self, *, key: str, request: EffectRequest) -> ProviderResult: ...

    def job_status(self, *, job_id: str) -> ProviderResult: ...


def supports_jobs(provider: object) -> bool:
    return callable(getattr(provider, "submit", None)) and callable(
        getattr(provider, "job_status", None)
    )
