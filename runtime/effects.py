"""The effect API for step code: one external side effect, performed exactly once.

    from runtime.effects import effect_perform

    @wf.effect("publish", next="done", action="publish")
    def publish(ctx):
        done = effect_perform(ctx, target="blog/why", request={"title": ..., "body": ...})
        return {"provider_operation_id": done.provider_operation_id}

The protocol (docs/design.md, "Side effects"):

1. derive the idempotency key from the run, the step, the action, the target (and an
   optional ``name`` for several effects of one step) and reserve it; the request's
   fingerprint is stored with it, so a re-run that would send a *different* request under
   the same key is refused instead of published twice;
2. mark the operation pending and commit a ``pending`` checkpoint, in one transaction;
3. call the provider with the key;
4. store the provider's operation id and result (operation ``confirmed``);
5. commit the post-action checkpoint (the side effect ``confirmed`` in the envelope).

A step that runs again after a crash finds its operation by key and never calls blindly:
confirmed → the stored result is returned with no call; pending → the provider is asked
first, and the request is sent again (same key, deduplicated by the provider) only when the
provider has no record of it; unknown → the step gives way to the restore, whose
reconciliation pauses the run for a person when the provider still cannot tell. A failed
operation did not happen: a later run of the step sends it under the next key
(the key ending ``.2``).
"""

from __future__ import annotations

import hashlib
import logging
import time
from dataclasses import dataclass
from typing import Any

from cairn.errors import ApprovalRequired, IdempotencyKeyReused, RunNotActive
from cairn.faults import fault_point
from checkpoints.models import ExternalOperation, OperationStatus
from runtime.context import StepContext
from runtime.errors import LeaseLost, PermanentStepError, RetryableStepError
from runtime.providers.base import (
    EffectRequest,
    Outcome,
    Provider,
    ProviderResult,
    supports_jobs,
)
from runtime.providers.registry import PUBLISHING, provider_get
from runtime.registry import workflow_code
from runtime.services.operations import (
    operation_attempt,
    operation_confirm,
    operation_envelope_entry,
    operation_fail,
    operation_mark_pending,
    operation_mark_unknown,
    operation_note,
    operation_reserve,
    operation_result,
    request_fingerprint,
)
from telemetry import tracing
from tenants.services import Actor

log = logging.getLogger("cairn.effects")

# The places a worker can die in the protocol; the crash tests stop a worker at each
# (the fault points ``effect.<boundary>``, cairn/faults.py).
BOUNDARIES = ("reserved", "pending", "accepted", "stored", "checkpointed")
# The places of a long-running tool: the job id recorded, the job observed (polling).
JOB_BOUNDARIES = ("submitted", "polling")


@dataclass(frozen=True)
class EffectDone:
    idempotency_key: str
    provider_operation_id: str
    result: dict[str, Any]
    replayed: bool  # True when the outcome was already known: no provider call was made


def effect_key(
    *, run_id: object, step: str, action: str, target: str, name: str = "", generation: int = 1
) -> str:
    """The stable idempotency key of one intended effect of one step of one run."""
    digest = hashlib.sha256(f"{run_id}|{step}|{action}|{target}|{name}".encode()).hexdigest()
    return f"cairn.{run_id}.{digest[:20]}.{generation}"


class _Effect:
    """One call of ``effect_perform``: the step's context, the operation, the provider."""

    def __init__(self, ctx: StepContext, provider: Provider, request: EffectRequest) -> None:
        self.ctx = ctx
        self.provider = provider
        self.request = request
        self.actor = ctx.actor

    # --- the envelope's side-effects group --------------------------------------------------
    def entry_status(self, key: str) -> str | None:
        for item in self.ctx.side_effects:
            if item.get("idempotency_key") == key:
                return item.get("status")
        return None

    def commit(self, operation: ExternalOperation, *, mark_pending: bool = False) -> None:
        """Commit a checkpoint at the step's state whose side-effects group shows the
        operation's status; with ``mark_pending`` the operation becomes pending in the same
        transaction. Raises LeaseLost when the run moved on."""
        entry = operation_envelope_entry(
            operation, status=OperationStatus.PENDING if mark_pending else None
        )
        key = entry["idempotency_key"]
        effects = [e for e in self.ctx.side_effects if e.get("idempotency_key") != key]
        effects.append(entry)

        def pending_with_the_checkpoint() -> None:
            operation_mark_pending(operation_id=operation.id, actor=self.actor)

        self.ctx.commit_side_effects(
            effects,
            pending_action=key if mark_pending else None,
            with_commit=pending_with_the_checkpoint if mark_pending else None,
        )

    # --- outcomes ---------------------------------------------------------------------------
    def done(self, operation: ExternalOperation, *, replayed: bool) -> EffectDone:
        if self.entry_status(operation.idempotency_key) != OperationStatus.CONFIRMED:
            self.commit(operation)  # the post-action checkpoint
            fault_point("effect.checkpointed")
        return EffectDone(
            idempotency_key=operation.idempotency_key,
            provider_operation_id=operation.provider_operation_id,
            result=operation_result(operation) or {},
            replayed=replayed,
        )

    def confirm(self, operation: ExternalOperation, answer: ProviderResult) -> EffectDone:
        operation = operation_confirm(
            operation_id=operation.id,
            provider_operation_id=answer.provider_operation_id,
            result=answer.result,
            actor=self.actor,
        )
        fault_point("effect.stored")
        return self.done(operation, replayed=False)

    def failed(self, operation: ExternalOperation, reason: str) -> PermanentStepError:
        operation_fail(operation_id=operation.id, reason=reason, actor=self.actor)
        return PermanentStepError(
            f"{self.provider.name} refused {operation.action} on {operation.target} "
            f"(operation {operation.idempotency_key}): {reason}"
        )

    def unknown(self, operation: ExternalOperation, reason: str) -> RetryableStepError:
        # The restore that follows reconciles it and, if the provider still cannot tell,
        # pauses the run for a person: the step never decides an ambiguity by itself.
        operation_mark_unknown(operation_id=operation.id, actor=self.actor, reason=reason)
        return RetryableStepError(
            f"the outcome of operation {operation.idempotency_key} is unknown: {reason}",
            delay_seconds=0,
        )

    def later(self, operation: ExternalOperation, reason: str) -> RetryableStepError:
        operation_note(operation_id=operation.id, note=reason)
        return RetryableStepError(
            f"operation {operation.idempotency_key} is still pending: {reason}"
        )

    # --- the protocol -----------------------------------------------------------------------
    def replayed(self, operation: ExternalOperation, *, noun: str) -> EffectDone | None:
        """The stored result of a confirmed operation (never performed again); raises
        RetryableStepError for one whose outcome is unknown (reconciled before the step runs
        again); None when the protocol goes on. One-shot effects and jobs share this."""
        if operation.status == OperationStatus.CONFIRMED:
            return self.done(operation, replayed=True)
        if operation.status == OperationStatus.UNKNOWN:
            raise RetryableStepError(
                f"the outcome of {noun} {operation.idempotency_key} is unknown; it is "
                "reconciled before the step runs again",
                delay_seconds=0,
            )
        return None

    def commit_pending(self, operation: ExternalOperation) -> None:
        """The pending checkpoint, committed before the provider is first asked."""
        self.commit(operation, mark_pending=True)
        fault_point("effect.pending")

    def run(self, operation: ExternalOperation) -> EffectDone:
        replayed = self.replayed(operation, noun="operation")
        if replayed is not None:
            return replayed
        if operation.status == OperationStatus.PENDING:
            # Sent before (or about to be) by a worker that died: ask before anything else.
            answer = self.provider.lookup(
                key=operation.idempotency_key, client_reference=operation.client_reference
            )
            if answer.outcome == Outcome.CONFIRMED:
                return self.confirm(operation, answer)
            if answer.outcome == Outcome.FAILED:
                raise self.failed(operation, answer.reason)
            if answer.outcome == Outcome.UNAVAILABLE:
                raise self.later(operation, answer.reason)
            if answer.outcome == Outcome.UNKNOWN:
                raise self.unknown(operation, answer.reason)
            # Not found: it never reached the provider. Sending it again under the same key
            # is safe even if the first request is still in flight: the provider dedups.
        else:
            self.commit_pending(operation)
        return self.send(operation)

    def send(self, operation: ExternalOperation) -> EffectDone:
        operation = operation_attempt(operation_id=operation.id, note="sent to the provider")
        answer = self.provider.perform(key=operation.idempotency_key, request=self.request)
        log.info(
            "effect sent",
            extra={
                "run": str(operation.run_id),
                "operation": operation.idempotency_key,
                "outcome": str(answer.outcome),
                "attempts": operation.attempts,
            },
        )
        if answer.outcome == Outcome.CONFIRMED:
            fault_point("effect.accepted")
            return self.confirm(operation, answer)
        if answer.outcome == Outcome.FAILED:
            raise self.failed(operation, answer.reason)
        if answer.outcome == Outcome.UNAVAILABLE:
            raise self.later(operation, answer.reason)
        # It may have happened: ask right away, before the attempt ends.
        found = self.provider.lookup(
            key=operation.idempotency_key, client_reference=operation.client_reference
        )
        if found.outcome == Outcome.CONFIRMED:
            return self.confirm(operation, found)
        if found.outcome == Outcome.FAILED:
            raise self.failed(operation, found.reason)
        if found.outcome == Outcome.UNKNOWN:
            raise self.unknown(operation, f"{answer.reason}; lookup: {found.reason}")
        raise self.later(operation, f"{answer.reason}; lookup: {found.reason or found.outcome}")


def _reserve(
    ctx: StepContext,
    *,
    action: str,
    target: str,
    request: dict[str, Any],
    provider: str,
    name: str,
    client_reference: str,
    actor: Actor,
) -> ExternalOperation:
    first = effect_key(run_id=ctx.run_id, step=ctx.step, action=action, target=target, name=name)
    base = first.rsplit(".", 1)[0] + "."
    earlier = list(
        ExternalOperation.objects.filter(run_id=ctx.run_id, idempotency_key__startswith=base)
        .order_by("created_at", "id")
        .values_list("status", flat=True)
    )
    generation = max(1, len(earlier))
    if earlier and earlier[-1] == OperationStatus.FAILED:
        generation += 1  # the last one did not happen: this is a new request
    key = f"{base}{generation}"
    try:
        operation, created = operation_reserve(
            tenant=ctx.tenant,
            run_id=ctx.run_id,
            idempotency_key=key,
            action=action,
            target=target,
            request_fingerprint=request_fingerprint(action=action, target=target, request=request),
            request=request,
            step=ctx.step,
            provider=provider,
            client_reference=client_reference,
            actor=actor,
        )
    except IdempotencyKeyReused as exc:
        raise PermanentStepError(
            f"{exc.detail} The step computed a different request for an effect it had "
            "already started; it must send the same request when it runs again."
        )
    except RunNotActive as exc:
        # Cancelled (or ended) while the step ran: its work is discarded, nothing was sent.
        raise LeaseLost(exc.detail)
    except ApprovalRequired as exc:
        # Past an approval state only the approved effect, on the approved artifact: the
        # step fails with the sentence, nothing was sent.
        raise PermanentStepError(exc.detail)
    if created:
        fault_point("effect.reserved")
    return operation


def _declared_action(ctx: StepContext) -> str:
    """The action the workflow's effect state declares, else the step's name."""
    code = workflow_code(ctx.workflow_type, ctx.workflow_version)
    spec = code.steps.get(ctx.state) if code else None
    return spec.effect_action if spec and spec.effect_action else ctx.step


def _reserve_and_run(effect: _Effect, *, provider: str, name: str) -> EffectDone:
    """Reserve the operation for ``effect``'s request (effect_perform and effect_job share
    the key scheme, so a job and a one-shot call are reserved the same way) and run it.

    Traced as one ``cairn.effect`` span: the action, the idempotency key, the provider's
    operation id and the outcome (an exception's type when it does not end confirmed);
    never the target, the request or the result."""
    with tracing.effect_span(
        run_id=effect.ctx.run_id, action=effect.request.action, provider=provider
    ) as span:
        operation = _reserve(
            effect.ctx,
            action=effect.request.action,
            target=effect.request.target,
            request=effect.request.payload,
            provider=provider,
            name=name,
            client_reference=effect.request.client_reference,
            actor=effect.actor,
        )
        if span.is_recording():
            span.set_attribute(tracing.EFFECT_KEY, operation.idempotency_key)
        done = effect.run(operation)
        if span.is_recording():
            span.set_attributes(
                {
                    tracing.EFFECT_OPERATION_ID: done.provider_operation_id,
                    tracing.EFFECT_REPLAYED: done.replayed,
                    tracing.OUTCOME: "confirmed",
                }
            )
        return done


def effect_perform(
    ctx: StepContext,
    *,
    target: str,
    request: dict[str, Any],
    provider: str = PUBLISHING,
    action: str | None = None,
    name: str = "",
    client_reference: str = "",
) -> EffectDone:
    """Perform ``action`` on ``target`` through the named provider adapter, exactly once for
    this run and step (see the module docstring for the protocol).

    ``action`` defaults to the one the effect state declares. ``request`` is JSON and holds
    no secrets (adapters resolve secret references themselves). Returns the provider's
    operation id and result. Raises RetryableStepError (the provider could not be reached,
    or the outcome is not known yet), PermanentStepError (the provider refused it, or the
    request differs from the one reserved under this key) or LeaseLost.
    """
    if action is None:
        action = _declared_action(ctx)
    adapter = provider_get(provider)
    effect = _Effect(
        ctx,
        adapter,
        EffectRequest(
            action=action, target=target, payload=request, client_reference=client_reference
        ),
    )
    return _reserve_and_run(effect, provider=provider, name=name)


class _Job(_Effect):
    """One call of ``effect_job``: submit once, record the job id, observe until it ends."""

    def __init__(
        self,
        ctx: StepContext,
        provider: Provider,
        request: EffectRequest,
        *,
        poll_seconds: float,
        max_wait_seconds: float,
    ) -> None:
        super().__init__(ctx, provider, request)
        self.poll_seconds = poll_seconds
        self.max_wait_seconds = max_wait_seconds

    def run(self, operation: ExternalOperation) -> EffectDone:
        replayed = self.replayed(operation, noun="job operation")
        if replayed is not None:
            return replayed
        if operation.provider_job_id:
            return self.observe(operation)  # submitted before: never again
        if operation.status == OperationStatus.RESERVED:
            self.commit_pending(operation)
        # Pending without a job id: the submission may have reached the provider before the
        # worker died; the same key is the same job there.
        return self.submit(operation)

    def submit(self, operation: ExternalOperation) -> EffectDone:
        operation = operation_attempt(operation_id=operation.id, note="job submitted")
        answer = self.provider.submit(key=operation.idempotency_key, request=self.request)
        if answer.outcome == Outcome.RUNNING and answer.job_id:
            self.ctx.job_record(idempotency_key=operation.idempotency_key, job_id=answer.job_id)
            fault_point("effect.submitted")
            operation.refresh_from_db()
            return self.observe(operation)
        if answer.outcome == Outcome.CONFIRMED:
            if answer.job_id:
                self.ctx.job_record(idempotency_key=operation.idempotency_key, job_id=answer.job_id)
            return self.confirm(operation, answer)
        if answer.outcome == Outcome.FAILED:
            raise self.failed(operation, answer.reason)
        if answer.outcome == Outcome.UNAVAILABLE:
            raise self.later(operation, answer.reason)
        raise self.unknown(operation, answer.reason or "the submission got no answer")

    def observe(self, operation: ExternalOperation) -> EffectDone:
        """Poll the recorded job until it ends (renewing the lease); a job still running
        after ``max_wait_seconds`` hands the step back to wait and observe again later."""
        job_id = operation.provider_job_id
        started = time.monotonic()
        while True:
            answer = self.provider.job_status(job_id=job_id)
            fault_point("effect.polling")
            if answer.outcome == Outcome.CONFIRMED:
                return self.confirm(operation, answer)
            if answer.outcome == Outcome.FAILED:
                raise self.failed(operation, answer.reason)
            if answer.outcome in (Outcome.NOT_FOUND, Outcome.UNKNOWN):
                raise self.unknown(operation, f"job {job_id}: {answer.reason}")
            if answer.outcome == Outcome.UNAVAILABLE:
                raise self.later(operation, f"job {job_id}: {answer.reason}")
            self.ctx.heartbeat()
            if time.monotonic() - started >= self.max_wait_seconds:
                raise RetryableStepError(
                    f"job {job_id} of operation {operation.idempotency_key} is still running",
                    delay_seconds=self.poll_seconds,
                )
            time.sleep(self.poll_seconds)


def effect_job(
    ctx: StepContext,
    *,
    target: str,
    request: dict[str, Any],
    provider: str = PUBLISHING,
    action: str | None = None,
    name: str = "",
    client_reference: str = "",
    poll_seconds: float = 1.0,
    max_wait_seconds: float = 300.0,
) -> EffectDone:
    """Run a long-running tool exactly once: reserve the key, commit the pending checkpoint,
    ``submit`` the job, record its id (``ctx.job_record``) *before* the first poll, then poll
    ``job_status`` until it succeeds (confirmed, with the result) or fails.

    A worker that dies at any point after the job id is recorded is followed by one that
    observes the same job: the restore's reconciliation asks ``job_status`` and this
    function, run again, polls the recorded job; neither submits again. The adapter must
    implement ``submit`` and ``job_status`` (``runtime.providers.base.JobProvider``).
    Raises what ``effect_perform`` raises; a job still running after ``max_wait_seconds``
    raises RetryableStepError (the run waits ``poll_seconds`` and observes it again).
    """
    if action is None:
        action = _declared_action(ctx)
    adapter = provider_get(provider)
    if not supports_jobs(adapter):
        raise PermanentStepError(f"the provider adapter '{provider}' has no job API")
    job = _Job(
        ctx,
        adapter,
        EffectRequest(
            action=action, target=target, payload=request, client_reference=client_reference
        ),
        poll_seconds=poll_seconds,
        max_wait_seconds=max_wait_seconds,
    )
    return _reserve_and_run(job, provider=provider, name=name)
