"""Running a run on a worker: lease, restore, run exactly the next eligible step, commit.

``run_advance`` is what the ``checkpoints.run_advance`` Celery task calls for every
``run.resume`` command. While it holds the lease it goes on to the next step directly
(every step is committed first), up to ``CAIRN_STEPS_PER_TASK`` steps, then hands over.

The lean loop: the first step of a task runs after the full validated restore. While the
worker holds the lease and the run is at the version its own commit wrote, the envelope it
committed *is* the restore, so a later step costs one read (is the run still ours, at that
version, still workable?) and one write (its commit). The commit also renews the lease,
charges the next step's attempt, and writes the run.resume it would publish as already
taken by this worker (the worker executes it; a crash leaves it to the sweep), so no stale
command is queued behind the run. A step that leaves a side effect unsettled sends the next
step through the full restore, which reconciles it.

Attempts: one step execution is one attempt, charged to the run (under the lease) *before*
the step function runs, so a worker killed mid-step has already spent it and a crash loop
ends in ``failed`` once ``max_attempts`` is used up. In the lean loop the previous step's
commit charges it.
"""

from __future__ import annotations

import json
import logging
import time
import traceback
from datetime import timedelta
from typing import Any
from uuid import UUID

from django.conf import settings
from django.db import InterfaceError, OperationalError, connection
from opentelemetry.trace import Span

from cairn import clock
from cairn.errors import (
    ArtifactHashMismatch,
    BudgetExhausted,
    CairnError,
    ConcurrentCheckpointWrite,
    IllegalTransition,
    LeaseHeld,
    RunNotActive,
    StorageUnavailable,
)
from cairn.faults import fault_point
from checkpoints.crypto import MissingKeyError
from checkpoints.envelope import json_problem
from checkpoints.models import ArtifactKind, Checkpoint, Execution, OutboxMessage, Run, RunStatus
from checkpoints.services.artifacts import artifact_store
from checkpoints.services.budgets import budget_exhausted
from checkpoints.services.checkpoints import (
    BUDGET_USED_KEYS,
    CommitRequest,
    CommitResult,
    StepAttempt,
    WorkerLoop,
    checkpoint_commit,
)
from checkpoints.services.commit_sql import RunHead, run_lease_check
from checkpoints.services.reads import run_read
from runtime.services.leases import Lease, lease_acquire
from runtime.services.operations import operations_envelope_entries
from telemetry import tracing
from tenants.services import Actor

from . import hooks
from .context import StepContext, evidence_normalize, put_by_name
from .definition import Next, StepSpec, Workflow
from .errors import LeaseLost, PermanentStepError, RetryableStepError
from .heartbeats import heartbeat_start
from .lease import LeaseKeeper, used_merge
from .model_client import ModelClient, ModelError, model_client_default
from .registry import workflow_code
from .restore import (
    CHECKS,
    Halt,
    Restored,
    credentials_check,
    missing_key_reason,
    policy_check,
    restore_latest,
)
from .status import run_handover, run_pause_for_review

log = logging.getLogger("cairn.runtime")

WORKABLE = frozenset(
    {RunStatus.RUNNING, RunStatus.WAITING_RETRY, RunStatus.WAITING_APPROVAL, RunStatus.RECONCILING}
)
# Side-effect statuses a restore has nothing to settle for: the lean loop may go on.
SETTLED_EFFECTS = frozenset({"confirmed", "failed"})


def run_advance(
    *,
    run_id: UUID | str,
    expected_version: int,
    owner: str | None = None,
    model: ModelClient | None = None,
) -> str:
    """Carry out one ``run.resume`` command. Returns what happened, as a word:
    ``stale`` / ``missing`` / ``inactive`` / ``not_due`` (nothing to do), ``lease_held``
    (another worker has it: back off, the rescue sweep re-queues when its lease expires),
    ``lease_lost``, or the run's resulting condition (``waiting_approval``,
    ``waiting_retry``, ``succeeded``, ``failed``, ``paused``, ``handed_over``), or
    ``on_hold``: an operator paused the run (before this command, or between two steps).

    Never raises for a domain condition; every write it makes is a service transaction.
    Traced as one ``cairn.run.advance`` span (in the run's trace: the command carried it),
    with its restore as an event and each step attempt as a span inside.
    """
    # This process beats before it takes any lease, so if it dies holding one, the rescue
    # knows within seconds (runtime.heartbeats).
    owner = owner or heartbeat_start()
    with tracing.advance_span(run_id=run_id, worker=owner) as span:
        outcome = _advance(
            run_id=run_id, expected_version=expected_version, owner=owner, model=model, span=span
        )
        if span.is_recording():
            span.set_attribute(tracing.OUTCOME, outcome)
        return outcome


def _advance(
    *,
    run_id: UUID | str,
    expected_version: int,
    owner: str,
    model: ModelClient | None,
    span: Span,
) -> str:
    # The protocol's own statements (the run's read, its lease, the restore's reads, an
    # attempt's charge) are timed by the task's span and the restore's event, not traced
    # one by one: a query span each would double what tracing costs a step, and say less
    # than the event. A step's own queries (its artifacts, its effects) are traced.
    with tracing.protocol_statements():
        taken = _lease(run_id=run_id, expected_version=expected_version, owner=owner, span=span)
    if isinstance(taken, str):
        return taken
    run, lease = taken
    keeper = LeaseKeeper(
        run=run, owner=owner, version=lease.run_version, ttl_seconds=settings.CAIRN_LEASE_SECONDS
    )
    try:
        return _Advance(
            run, keeper, model or model_client_default(), took_over=lease.took_over
        ).work()
    except LeaseLost as exc:
        log.warning("lease lost; work discarded", extra={"run": str(run.pk), "why": str(exc)})
        return "lease_lost"
    except DATABASE_LOST:
        # The database went away mid-task (a restart, a failover): this step's work is lost,
        # and the run is handed back as soon as the database answers again, so it does not
        # sit out this worker's lease (the command that brought it here is spent).
        keeper.stop_renewing()
        log.warning("database lost mid-task; handing the run back", extra={"run": str(run.pk)})
        return "handed_back" if _hand_back_when_it_answers(run, owner) else "database_lost"
    finally:
        keeper.release()


def _lease(
    *, run_id: UUID | str, expected_version: int, owner: str, span: Span
) -> tuple[Run, Lease] | str:
    """The run and this worker's lease on it, or the word for why there is nothing to do."""
    run = run_read(run_id=run_id)
    if run is None:
        log.info("command for a missing run ignored", extra={"run": str(run_id)})
        return "missing"
    if run.version != expected_version:
        log.info(
            "stale command ignored",
            extra={"run": str(run.pk), "expected": expected_version, "version": run.version},
        )
        return "stale"
    if run.status not in WORKABLE or run.execution != Execution.WORKER:
        return "inactive"  # ended, paused, cancelling, or driven by an external caller
    if run.paused:
        # An operator's hold (runtime.services.pause): a command sent before it starts no
        # step. Unpausing queues the run's command again.
        log.info("command for a paused run ignored", extra={"run": str(run.pk)})
        return "on_hold"
    if (
        run.status == RunStatus.WAITING_RETRY
        and run.next_eligible_at
        and run.next_eligible_at > clock.now()  # the outbox published it on the database's
    ):
        return "not_due"
    try:
        lease = lease_acquire(
            tenant=run.tenant,
            run_id=run.pk,
            owner=owner,
            ttl_seconds=settings.CAIRN_LEASE_SECONDS,
            expected_version=expected_version,
            run=run,
        )
    except LeaseHeld:
        log.info("run leased by another worker; backing off", extra={"run": str(run.pk)})
        return "lease_held"
    except ConcurrentCheckpointWrite:
        return "stale"
    except RunNotActive:
        return "inactive"
    if lease.took_over:
        log.warning(
            "took over an expired lease (restore)",
            extra={"run": str(run.pk), "restore_count": lease.restore_count},
        )
    fault_point("run.leased")  # a worker may die right here, holding the lease
    if span.is_recording():
        span.set_attributes(
            {
                tracing.TENANT: run.tenant.slug,
                tracing.WORKFLOW_TYPE: run.workflow_type,
                tracing.WORKFLOW_VERSION: run.workflow_version,
                tracing.RESTORE_COUNT: lease.restore_count,
            }
        )
    run.lease_owner, run.lease_expires_at = owner, lease.expires_at
    run.restore_count = lease.restore_count
    return run, lease


# A database that went away (the connection broke, the server restarted), not a query error.
DATABASE_LOST = (OperationalError, InterfaceError)
HAND_BACK_PATIENCE_SECONDS = 60.0


def _hand_back_when_it_answers(run: Run, owner: str) -> bool:
    """End this worker's lease of ``run`` and queue it again, once the database answers
    (within ``HAND_BACK_PATIENCE_SECONDS``; after that the lease expires by itself)."""
    from .rescue import run_lease_end

    deadline = time.monotonic() + HAND_BACK_PATIENCE_SECONDS
    while True:
        if not connection.in_atomic_block:  # (a test's transaction: nothing broke)
            connection.close_if_unusable_or_obsolete()  # a broken one: the next reconnects
        try:
            return run_lease_end(run=run, owner=owner, why="run handed back after a database loss")
        except DATABASE_LOST:
            if time.monotonic() > deadline:
                return False
            time.sleep(1.0)


class _OnHold(Exception):
    """The run was paused by an operator between this worker's steps."""


class _Advance:
    def __init__(
        self, run: Run, keeper: LeaseKeeper, model: ModelClient, *, took_over: bool = False
    ) -> None:
        self.run = run
        self.took_over = took_over  # this task's lease was a dead worker's (a restore)
        self.step_span: Span | None = None  # the step attempt being executed
        self.step_checkpoint: dict | None = None  # what it committed, for its span
        self.keeper = keeper
        self.model = model
        self.code: Workflow | None = workflow_code(run.workflow_type, run.workflow_version)
        self.actor = Actor.system(f"worker {keeper.owner}")
        # The restore the next step may use instead of reading one: what this worker's own
        # last commit wrote, while nothing it cannot see is left to reconcile.
        self.lean: Restored | None = None
        self.prepaid = False  # the last commit charged the next step's attempt
        self.last_turn = False

    def work(self) -> str:
        try:
            return self.turns()
        except _OnHold:
            return self.stop_for_hold()

    def turns(self) -> str:
        # The lease is renewed by each step's attempt charge or commit (and in the
        # background during a long step), so the loop itself writes nothing before a step.
        for turn in range(settings.CAIRN_STEPS_PER_TASK):
            self.last_turn = turn == settings.CAIRN_STEPS_PER_TASK - 1
            restored = self.lean
            self.lean = None
            if restored is not None:
                self.still_ours()  # the step's one read
                # The restore's time-dependent policy (docs/design.md#restore, "Policy that
                # depends on time"): the step's secrets still resolve, budgets and deadline.
                halt = credentials_check(self.code, restored) or policy_check(self.run, restored)
                if halt:
                    return self.halt(halt)
            else:
                self.prepaid = False
                with tracing.protocol_statements():
                    restored = self.restore(turn)
                self.restore_traced(restored)
                if isinstance(restored, Halt):
                    return self.halt(restored)
            try:
                outcome = self.next_step(restored)
            except MissingKeyError as exc:
                # Never out of the task (the sweep would re-queue the run forever): pause.
                return self.pause(missing_key_reason(exc, f"data the run's {self.run.state} reads"))
            if outcome != "continue":
                return outcome
        return "handed_over" if self.handover() else "lease_lost"

    def restore(self, turn: int) -> Restored | Halt:
        """The full restore of the run this worker holds (restore steps 2 to 6)."""
        if turn == 0:
            # Read just before the lease was granted at this very version.
            run = self.run
        else:
            run = self.run = run_read(run_id=self.run.pk)
            if run is None:
                raise LeaseLost("the run is gone")
        if run.version != self.keeper.version or run.status not in WORKABLE:
            raise LeaseLost("the run changed while this worker held its lease")
        if run.paused:
            raise _OnHold()
        self.keeper.head = RunHead.of(run)
        return restore_latest(run, self.code)

    def restore_traced(self, restored: Restored | Halt) -> None:
        """The restore as an event of the task's span: the checks it passed, in order, and
        the one that stopped the run (its reason stays in the run's status, not here)."""
        if not tracing.current_span().is_recording():
            return
        halted = restored.check if isinstance(restored, Halt) else ""
        passed = CHECKS[: CHECKS.index(halted)] if halted in CHECKS else CHECKS
        done = restored.restored if isinstance(restored, Halt) else restored
        tracing.event(
            tracing.RESTORE_EVENT,
            {
                "cairn.restore.checks": ["lease", *passed],
                "cairn.restore.halted_at": halted or None,
                tracing.OUTCOME: restored.action if isinstance(restored, Halt) else "restored",
                "cairn.restore.took_over": self.took_over,
                tracing.RESTORE_COUNT: self.run.restore_count,
                tracing.SEQUENCE: self.run.checkpoint_sequence,
                "cairn.restore.migrated_from": done.migrated_from if done else None,
            },
        )
        self.took_over = False  # a later full restore of this task takes nothing over

    def still_ours(self) -> None:
        """One read before a lean step: the run is at the version this worker wrote, still
        leased by it and workable (an operator's cancel or pause moves the version)."""
        row = run_lease_check(run_id=self.run.pk)
        if row is None or row[0] != self.keeper.version or row[1] not in WORKABLE:
            raise LeaseLost("the run changed while this worker held its lease")
        if row[2] != self.keeper.owner:
            raise LeaseLost("the run's lease is no longer this worker's")
        if row[3]:
            raise _OnHold()

    def stop_for_hold(self) -> str:
        """An operator paused the run while this worker had it: the step it was running has
        committed; it starts no other. The command its last commit wrote for it stays unsent
        and unclaimed, held by the relay until the run is unpaused; the lease is released
        (``keeper.release``)."""
        self.keeper.stop_renewing()
        taken, self.keeper.taken_outbox_id = self.keeper.taken_outbox_id, None
        if taken is not None:
            OutboxMessage.objects.filter(pk=taken, sent_at__isnull=True).update(claimed_until=None)
        log.info("run paused by an operator; worker stops", extra={"run": str(self.run.pk)})
        return "on_hold"

    def handover(self) -> bool:
        self.keeper.stop_renewing()
        return run_handover(run=self.run, version=self.keeper.version, owner=self.keeper.owner)

    # --- step 7: the next eligible step ---------------------------------------------------
    def next_step(self, restored: Restored) -> str:
        run, code = self.run, self.code
        state = run.state
        if state in run.workflow.definition.get("terminal", []):
            return "succeeded"
        if code is None:
            return self.pause(
                f"workflow {run.workflow_type} version {run.workflow_version} is not declared "
                "by any module this worker loads (CAIRN_WORKFLOW_MODULES)"
            )
        if state in code.approvals:
            return self.approval(restored, code.approvals[state])
        spec = code.steps.get(state)
        if spec is None:
            return self.pause(
                f"checkpoint {restored.checkpoint.sequence} is at state '{state}', which the "
                f"workflow code {code.workflow_type}@{code.version} (code version "
                f"{code.code_version}) no longer has a step for"
            )
        halt = policy_check(run, restored, attempt_needed=True)
        if halt:
            return self.halt(halt)
        return self.execute(spec, restored)

    def execute(self, spec: StepSpec, restored: Restored) -> str:
        keeper = self.keeper
        if self.prepaid:  # the previous commit charged this attempt and renewed the lease
            used = keeper.usage_now()
        else:
            used = keeper.charge(attempts_used=1)  # spent before the step runs: module doc
        self.prepaid = False
        with tracing.step_span(
            run_id=self.run.pk,
            step=spec.name,
            attempt=int(used.get("attempts_used", 0)),
            worker=keeper.owner,
            run_trace=self.run.trace_context,
        ) as span:
            self.step_span, self.step_checkpoint = span, None
            try:
                outcome = self.attempt(spec, restored, used)
            finally:
                self.step_span = None
            tracing.step_ended(span, outcome=outcome, checkpoint=self.step_checkpoint)
            return outcome

    def attempt(self, spec: StepSpec, restored: Restored, used: dict) -> str:
        """Run one attempt of ``spec`` (its attempt already charged) and commit it."""
        keeper = self.keeper
        keeper.restart_clock()  # the step's own time is charged by its checkpoint
        ctx = StepContext(
            run=self.run,
            spec=spec,
            envelope=restored.envelope,
            used=used,
            keeper=keeper,
            model=self.model,
            actor=self.actor,
            code_version=self.code.code_version if self.code else "",
        )
        log.info(
            "step started",
            extra={"run": str(self.run.pk), "step": spec.name, "attempts": ctx.attempts_used},
        )
        failure: tuple[str, str, float | None] | None = None
        failed_with: BaseException | None = None
        returned: Any = None
        began = _AttemptClock(
            number=ctx.attempts_used,
            step=spec.name,
            worker=keeper.owner,
            model_calls=ctx.model_call_log,
        )
        keeper.start_renewing()
        try:
            returned = spec.fn(ctx)
        except LeaseLost:
            raise
        except RetryableStepError as exc:
            failure, failed_with = ("retry", exc.reason, exc.delay_seconds), exc
        except PermanentStepError as exc:
            failure, failed_with = ("fail", exc.reason, None), exc
        except ModelError as exc:
            failure, failed_with = ("retry" if exc.retryable else "fail", str(exc), None), exc
        except StorageUnavailable as exc:  # a full disk, an unreachable bucket: try later
            failure, failed_with = ("retry", exc.detail, None), exc
        except MissingKeyError as exc:
            # Retrying cannot help: no worker with these keys can read what the step needs.
            keeper.stop_renewing()
            keeper.flush_elapsed()
            return self.pause(missing_key_reason(exc, f"data step {spec.name} reads"))
        except Exception as exc:  # an unexpected error may be transient: it costs an attempt
            log.exception("step raised", extra={"run": str(self.run.pk), "step": spec.name})
            failure, failed_with = ("retry", f"{type(exc).__name__}: {exc}", None), exc
        finally:
            keeper.stop_renewing()
        if failure is not None:
            return self.step_failed(
                spec,
                restored,
                keeper.usage_now(),
                *failure,
                side_effects=ctx.side_effects,
                attempt=began,
                error=failed_with,
            )
        try:
            target, output = _interpret(spec, returned)
        except PermanentStepError as exc:
            keeper.flush_elapsed()  # no checkpoint records this step's time
            return self.pause(exc.reason)
        evidence = ctx.evidence
        evidence["outputs"][spec.name] = output
        groups = self.groups(
            restored, evidence=evidence, used=keeper.usage_now(), side_effects=ctx.side_effects
        )
        return self.commit(
            state=target, step=spec.name, groups=groups, attempt=began.ended("committed")
        )

    def step_failed(
        self,
        spec: StepSpec,
        restored: Restored,
        used: dict,
        kind: str,
        reason: str,
        delay: float | None,
        *,
        side_effects: list[dict[str, Any]],
        attempt: _AttemptClock,
        error: BaseException | None,
    ) -> str:
        """Commit the failed or retry-waiting checkpoint. Its evidence is the restored one
        (a failed step's outputs are not accepted) plus the attempt's traceback (an
        encrypted artifact, ``traceback:<step>``), but its side effects are every one the
        step's context knows, as the operations table has them now: an effect the step
        started (its pending checkpoint is already committed) stays in the history."""
        side_effects = operations_envelope_entries(run_id=self.run.pk, entries=side_effects)
        limit = (self.run.budget_limits or {}).get("max_attempts")
        attempts = used["attempts_used"]
        if kind == "retry" and limit is not None and attempts >= limit:
            kind = "fail"
            reason = (
                f"budget exhausted: attempts used {attempts} of {limit}; "
                f"the last attempt of {spec.name} failed: {reason}"
            )
        elif kind == "fail":
            reason = f"{spec.name} failed: {reason}"
        evidence = evidence_normalize(restored.envelope.get("evidence"))
        traceback_ref = _traceback_store(self.run, spec.name, error, evidence)
        record = attempt.ended(
            "failed" if kind == "fail" else "retry",
            error_type=type(error).__name__ if error is not None else "",
            traceback=traceback_ref,
        )
        status, eligible = RunStatus.FAILED, None
        if kind != "fail":
            delay = settings.CAIRN_RETRY_DELAY_SECONDS if delay is None else max(0.0, float(delay))
            eligible = clock.now() + timedelta(seconds=delay)  # due on the database's clock
            reason = f"attempt {attempts} ({spec.name}) failed: {reason}"
            status = RunStatus.WAITING_RETRY
        groups = self.groups(
            restored,
            used=used,
            reason=reason,
            next_eligible_at=eligible,
            side_effects=side_effects,
            evidence=evidence,
        )
        return self.commit(
            state=self.run.state,
            step="",
            groups=groups,
            status=status,
            reason=reason,
            next_eligible_at=eligible,
            attempt=record,
        )

    def approval(self, restored: Restored, spec) -> str:  # noqa: ANN001
        outcome = hooks.approval_gate(run=self.run, spec=spec, envelope=restored.envelope)
        tracing.event(
            tracing.APPROVAL_EVENT,
            {
                "cairn.approval.decision": outcome.decision,
                "cairn.approval.action": spec.action,
                "cairn.approval.request_id": _text_or_none(
                    outcome.evidence.get("control", {}).get("approval_request_id")
                ),
                tracing.STATE: spec.state,
            },
        )
        if outcome.decision == "wait":
            return "waiting_approval"
        evidence = evidence_normalize(restored.envelope.get("evidence"))
        for item in outcome.evidence.get("validators", []):
            evidence["validators"] = [
                v for v in evidence["validators"] if v.get("name") != item.get("name")
            ] + [item]
        # Approved with edits: the reviewer's edit replaces the artifact of its name, so the
        # steps after the approval state read (and ship) the edited bytes.
        for ref in outcome.evidence.get("artifacts", []):
            evidence["artifacts"] = [
                a if a.get("name") != ref.get("name") else dict(ref) for a in evidence["artifacts"]
            ]
        groups = self.groups(restored, evidence=evidence, used=restored.used)
        groups["control"].update(outcome.evidence.get("control", {}))
        # The move past an approval state records the decision it used: transition
        # evidence, which retention keeps.
        if outcome.decision == "approved":
            # The gate found the approval; the commit below consumes it with the move, so a
            # worker that dies here leaves it approved and unused for the next.
            fault_point("approval.granted")
            return self.commit(state=spec.next, step=spec.state, groups=groups, is_evidence=True)
        reason = outcome.reason or "the reviewer rejected the request"
        groups["control"]["reason"] = reason
        return self.commit(
            state=spec.rejected or self.run.state,
            step=spec.state if spec.rejected else "",
            groups=groups,
            status=RunStatus.FAILED,
            reason=reason,
            is_evidence=True,
        )

    # --- writing ----------------------------------------------------------------------------
    def groups(
        self,
        restored: Restored,
        *,
        used: dict,
        evidence: dict | None = None,
        side_effects: list[dict[str, Any]] | None = None,
        reason: str | None = None,
        next_eligible_at=None,  # noqa: ANN001
    ) -> dict[str, Any]:
        envelope = restored.envelope
        control = dict(envelope.get("control") or {})
        control.update(
            {
                "lease_owner": self.keeper.owner[:500],
                "actor": self.actor.name[:500],
                "reason": reason[:2000] if reason else None,
                "next_eligible_at": next_eligible_at.isoformat() if next_eligible_at else None,
            }
        )
        inputs = dict(envelope.get("inputs") or {})
        if self.code is not None:
            # Reproducibility: which prompt, policy and model did this work.
            inputs.update(
                {
                    "prompt_version": self.code.prompt_version[:100],
                    "policy_version": self.code.policy_version[:100],
                    "model": str(getattr(self.model, "name", "") or "")[:200],
                }
            )
        return {
            "inputs": inputs,
            "evidence": evidence
            if evidence is not None
            else evidence_normalize(envelope.get("evidence")),
            "side_effects": side_effects
            if side_effects is not None
            else envelope.get("side_effects") or [],
            "budgets": {key: used[key] for key in BUDGET_USED_KEYS},
            "control": control,
        }

    def commit(
        self,
        *,
        state: str,
        step: str,
        groups: dict[str, Any],
        status: str | None = None,
        reason: str = "",
        next_eligible_at=None,  # noqa: ANN001
        is_evidence: bool = False,
        attempt: StepAttempt | None = None,
    ) -> str:
        """Commit the run's next checkpoint. A plain step's result is not ``is_evidence``:
        retention may compact it once the run is over (the effect and approval checkpoints
        that carry transition evidence are marked where they are written)."""
        charge_next = self.charge_next(state, groups)
        try:
            result = checkpoint_commit(
                tenant=self.run.tenant,
                run_id=self.run.pk,
                head=self.keeper.head,
                request=CommitRequest(
                    expected_version=self.keeper.version,
                    state=state,
                    step=step,
                    envelope=groups,
                    actor=self.actor,
                    status=status,
                    status_reason=reason,
                    lease_owner=self.keeper.owner,
                    next_eligible_at=next_eligible_at,
                    code_version=self.code.code_version if self.code else "",
                    is_evidence=is_evidence,
                    attempt=attempt,
                    worker=WorkerLoop(
                        consumed_outbox_id=self.keeper.taken_outbox_id,
                        charge_next_attempt=charge_next,
                    ),
                ),
            )
        except (ConcurrentCheckpointWrite, LeaseHeld, RunNotActive) as exc:
            raise LeaseLost(exc.detail)
        except BudgetExhausted as exc:
            # The step spent past a limit (a model call's tokens land after it returns):
            # the run fails where it stands, recording that usage; its output is not kept.
            groups = {**groups, "control": {**groups["control"], "reason": exc.detail[:2000]}}
            return self.commit(
                state=self.run.state,
                step="",
                groups=groups,
                status=RunStatus.FAILED,
                reason=exc.detail.split(". Nothing was written")[0],
            )
        except (IllegalTransition, ArtifactHashMismatch, CairnError) as exc:
            self.keeper.flush_elapsed()  # the refused checkpoint did not record the time
            fields = f" ({json.dumps(exc.fields)[:500]})" if exc.fields else ""
            return self.pause(
                f"the checkpoint for {step or state} was refused: {exc.detail}{fields}"
            )
        self.keeper.committed(version=result.run_version, used=groups["budgets"], head=result.head)
        if self.step_span is not None and self.step_span.is_recording():
            # The checkpoint this step attempt committed, recorded when the step ends.
            self.step_checkpoint = tracing.committed(result, state=state)
        log.info(
            "step committed",
            extra={"run": str(self.run.pk), "step": step, "sequence": result.sequence},
        )
        if result.status in (RunStatus.RUNNING, RunStatus.WAITING_APPROVAL):
            # This worker goes on: the commit's run.resume is its own (claimed, not sent).
            self.keeper.taken_outbox_id = result.outbox_id
            self.carry_on(result, groups, prepaid=charge_next)
            return "continue"  # at an approval state, the gate decides on the next turn
        self.keeper.taken_outbox_id = None  # the commit marked it sent
        return {
            RunStatus.SUCCEEDED: "succeeded",
            RunStatus.FAILED: "failed",
            RunStatus.WAITING_RETRY: "waiting_retry",
        }.get(result.status, str(result.status))

    def leanable(self, groups: dict[str, Any]) -> bool:
        """Whether the next step may use this commit's envelope as its restore: not on the
        task's last turn, and only with every side effect settled (else reconcile first)."""
        return not self.last_turn and all(
            effect.get("status") in SETTLED_EFFECTS for effect in groups.get("side_effects", [])
        )

    def charge_next(self, state: str, groups: dict[str, Any]) -> bool:
        """Charge the next step's attempt in this commit: only when the next turn is lean and
        will run a step that its budgets allow (as the policy check before it would)."""
        if self.code is None or state not in self.code.steps or not self.leanable(groups):
            return False
        used = {**groups["budgets"], "attempts_used": groups["budgets"]["attempts_used"] + 1}
        limits = self.run.budget_limits or {}
        limit = limits.get("max_attempts")
        if limit is not None and groups["budgets"]["attempts_used"] >= limit:
            return False
        return budget_exhausted(Run(budget_limits=limits, budget_used=used)) is None

    def carry_on(self, result: CommitResult, groups: dict[str, Any], *, prepaid: bool) -> None:
        """Make this commit the next step's restore (the lean loop), when it may be."""
        run, head = self.run, result.head
        run.version, run.state, run.status = head.version, head.state, head.status
        run.checkpoint_sequence = head.checkpoint_sequence
        run.latest_checkpoint_id = head.latest_checkpoint_id
        run.latest_checkpoint_sha256 = head.latest_checkpoint_sha256
        run.budget_used = head.budget_used
        run.step = result.envelope["position"]["step"]
        if not self.leanable(groups):
            return
        envelope = result.envelope
        checkpoint = Checkpoint(
            id=result.checkpoint_id,
            tenant_id=run.tenant_id,
            run_id=run.pk,
            sequence=result.sequence,
            parent_id=envelope["identity"]["parent_checkpoint_id"],
            state=run.state,
            step=run.step,
            schema_version=envelope["schema_version"],
            sha256=result.sha256,
            parent_sha256=result.parent_sha256,
        )
        self.prepaid = prepaid and head.status == RunStatus.RUNNING
        self.lean = Restored(
            checkpoint=checkpoint, envelope=envelope, used=used_merge(envelope["budgets"])
        )

    def pause(self, reason: str) -> str:
        self.keeper.stop_renewing()
        paused = run_pause_for_review(
            run_id=self.run.pk,
            expected_version=self.keeper.version,
            reason=reason,
            actor=self.actor,
        )
        if not paused:
            raise LeaseLost("the run moved on before it could be paused")
        return "paused"

    def halt(self, halt: Halt) -> str:
        if halt.action == "fail" and halt.restored is not None:
            groups = self.groups(halt.restored, used=halt.restored.used, reason=halt.reason)
            return self.commit(
                state=self.run.state,
                step="",
                groups=groups,
                status=RunStatus.FAILED,
                reason=halt.reason,
            )
        return self.pause(halt.reason)


def _text_or_none(value: object) -> str | None:
    return None if value is None else str(value)


def _interpret(spec: StepSpec, returned: Any) -> tuple[str, dict[str, Any]]:
    """A step returns Next(state, output), or an output dict (or None) when it has exactly
    one next state. Raises PermanentStepError for anything else."""
    if isinstance(returned, Next):
        target, output = returned.state, returned.output
    elif returned is None or isinstance(returned, dict):
        if len(spec.next) != 1:
            raise PermanentStepError(
                f"step {spec.name} may lead to {', '.join(spec.next)}: it must return "
                "Next(state, output) to choose"
            )
        target, output = spec.next[0], returned or {}
    else:
        raise PermanentStepError(
            f"step {spec.name} returned {type(returned).__name__}; it must return a dict "
            "or Next(state, output)"
        )
    if target not in spec.next:
        raise PermanentStepError(
            f"step {spec.name} chose '{target}', which it does not declare as a next state"
        )
    problem = json_problem(output, where="the output")
    if problem:
        raise PermanentStepError(f"step {spec.name} returned output that is not JSON: {problem}")
    return target, output


class _AttemptClock:
    """When an attempt started, on the wall clock for the record and the monotonic clock
    for its duration."""

    def __init__(
        self, *, number: int, step: str, worker: str, model_calls: list[dict[str, Any]]
    ) -> None:
        self.number, self.step, self.worker = number, step, worker
        self.model_calls = model_calls  # the step context's, filled as the step calls
        self.started_at = clock.now()
        self._began = time.monotonic()

    def ended(
        self, outcome: str, *, error_type: str = "", traceback: dict[str, str] | None = None
    ) -> StepAttempt:
        return StepAttempt(
            number=self.number,
            step=self.step,
            worker=self.worker,
            started_at=self.started_at,
            duration_ms=round((time.monotonic() - self._began) * 1000),
            outcome=outcome,
            error_type=error_type,
            traceback=traceback,
            model_calls=tuple(self.model_calls),
        )


# A traceback is kept whole up to this size (its innermost frames: the end); beyond, cut.
TRACEBACK_LIMIT = 64 * 1024


def _traceback_store(
    run: Run, step: str, error: BaseException | None, evidence: dict[str, Any]
) -> dict[str, str] | None:
    """Store the failed attempt's traceback as an encrypted artifact and name it in
    ``evidence`` as ``traceback:<step>`` (the latest failure of each step; retention keeps
    what a checkpoint names). A storage failure costs the traceback, never the failure's
    checkpoint."""
    if error is None:
        return None
    text = "".join(traceback.format_exception(error))[-TRACEBACK_LIMIT:]
    try:
        artifact, _ = artifact_store(
            tenant=run.tenant,
            data=text.encode("utf-8"),
            media_type="text/plain; charset=utf-8",
            kind=ArtifactKind.TRACEBACK,
        )
    except StorageUnavailable:
        log.warning("traceback not stored", extra={"run": str(run.pk), "step": step})
        return None
    ref = {"id": str(artifact.id), "sha256": artifact.sha256}
    put_by_name(
        evidence["artifacts"], {**ref, "name": f"traceback:{step}", "kind": ArtifactKind.TRACEBACK}
    )
    return ref
