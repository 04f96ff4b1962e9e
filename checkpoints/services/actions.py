"""Operator actions on a run: resume, cancel, retry a named step, grant budget.

(Forks live in ``checkpoints.services.forks``.) Every action

- is one transaction with its audit event (actor and reason): all of it happens or none;
- is guarded by the run's optimistic version: ``UPDATE run … WHERE id = ? AND version = ?``
  that increments the version; a stale ``expected_version`` raises
  ConcurrentCheckpointWrite (409) and nothing is written;
- appends and never rewrites: checkpoints are only ever added (retry), statuses change.

Because every action moves the version, a command a worker holds for the old version
becomes a no-op; an action that leaves the run able to continue therefore enqueues the next
``run.resume`` itself, in the same transaction.

Cancel and reconciliation: a run with operations whose outcome is not settled (reserved,
pending or unknown) cannot be cancelled at once, because a side effect may be in flight.
``run_cancel`` moves it to ``cancelling``; whoever settles an operation (the reconciler, or
an operator recording the outcome) then calls ``run_cancel_complete``, which finishes the
cancel once nothing is open. ``runs_cancel_sweep`` is the periodic safety net.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import F, QuerySet
from django.utils import timezone

from checkpoints.errors import (
    ActionNotAllowed,
    BudgetExhausted,
    ConcurrentCheckpointWrite,
    InvalidRequest,
    NotFound,
    RunNotActive,
    UnknownStep,
)
from checkpoints.models import Execution, ExternalOperation, OperationStatus, Run, RunStatus
from checkpoints.services import outbox
from checkpoints.services.budgets import budget_exhausted
from checkpoints.services.checkpoints import checkpoint_commit, latest_envelope
from tenants.models import Tenant
from tenants.services import Actor, audit_record

log = logging.getLogger("cairn.actions")

MAX_REASON = 2000
# Operations whose side effect may be in flight or happened without our knowing.
OPEN_OPERATION_STATUSES = (
    OperationStatus.RESERVED,
    OperationStatus.PENDING,
    OperationStatus.UNKNOWN,
)
RESUMABLE = frozenset({RunStatus.PAUSED_FOR_REVIEW, RunStatus.WAITING_RETRY, RunStatus.FAILED})
# Retry is refused while reconciling: a new write must wait until unknown outcomes are known.
RETRYABLE = frozenset(
    {
        RunStatus.RUNNING,
        RunStatus.WAITING_RETRY,
        RunStatus.WAITING_APPROVAL,
        RunStatus.PAUSED_FOR_REVIEW,
        RunStatus.FAILED,
    }
)
FINISHED = frozenset({RunStatus.CANCELLED, RunStatus.SUCCEEDED})
GRANT_KEYS = {"attempts": "max_attempts", "tokens": "max_tokens", "cost": "max_cost"}

_NOT_RESUMABLE = {
    RunStatus.RUNNING: "The run is already running; there is nothing to resume.",
    RunStatus.WAITING_APPROVAL: (
        "The run waits for an approval; decide the approval request instead of resuming."
    ),
    RunStatus.RECONCILING: (
        "The run is reconciling an operation whose outcome is unknown; record the outcome "
        "of that operation first."
    ),
    RunStatus.CANCELLING: "The run is being cancelled; it cannot be resumed.",
}


# --- shared guards --------------------------------------------------------------------------
def reason_clean(reason: str | None, *, required: bool = True) -> str:
    """The trimmed reason. Raises InvalidRequest when it is missing (and required) or long."""
    text = (reason or "").strip()
    if required and not text:
        raise InvalidRequest(
            "Give a reason: it is recorded with the action in the audit trail.",
            fields={"reason": "required"},
        )
    if len(text) > MAX_REASON:
        raise InvalidRequest(
            f"The reason is {len(text)} characters; the limit is {MAX_REASON}.",
            fields={"reason": f"at most {MAX_REASON} characters"},
        )
    return text


def _locked_run(*, tenant: Tenant, run_id: UUID | str) -> Run:
    """The tenant's run, its row locked for the transaction (PostgreSQL; SQLite's
    IMMEDIATE transactions already serialize writers). NotFound for another tenant's run."""
    try:
        return (
            Run.objects.select_related("workflow")
            .select_for_update(of=("self",))
            .get(tenant=tenant, pk=run_id)
        )
    except (Run.DoesNotExist, ValueError, ValidationError):
        raise NotFound("No such run.")


def stale_version_error(run: Run, expected_version: int) -> ConcurrentCheckpointWrite:
    return ConcurrentCheckpointWrite(
        f"The run changed since you loaded it: it is at version {run.version}, not "
        f"{expected_version}. Nothing was done; reload the run and decide again."
    )


def version_check(run: Run, expected_version: int | None) -> int:
    if expected_version is not None and run.version != expected_version:
        raise stale_version_error(run, expected_version)
    return run.version


def _bump(run: Run, expected_version: int, **fields: Any) -> int:
    """The conditional update every action makes; returns the new version."""
    updated = Run.objects.filter(pk=run.pk, version=expected_version).update(
        version=F("version") + 1, updated_at=timezone.now(), **fields
    )
    if updated != 1:
        run.refresh_from_db(fields=["version"])
        raise stale_version_error(run, expected_version)
    return expected_version + 1


def open_operations(run: Run) -> QuerySet[ExternalOperation]:
    return ExternalOperation.objects.filter(run=run, status__in=OPEN_OPERATION_STATUSES)


def _continue(run: Run, version: int, available_at: datetime | None = None) -> None:
    """Enqueue the command that lets the run go on at ``version`` (worker runs), or the
    event an external driver may watch."""
    kind = "run.resume" if run.execution == Execution.WORKER else "run.resumed"
    outbox.outbox_enqueue(
        run=run,
        kind=kind,
        payload={"run_id": str(run.id), "expected_version": version},
        available_at=available_at,
    )


def _refuse_finished(run: Run, what: str) -> None:
    if run.status in FINISHED:
        raise RunNotActive(f"The run is {run.status}; it cannot be {what}.")
    if run.status == RunStatus.CANCELLING:
        raise RunNotActive(f"The run is being cancelled; it cannot be {what}.")


def _refuse_exhausted(run: Run, what: str) -> None:
    exhausted = budget_exhausted(run)
    if exhausted:
        raise BudgetExhausted(
            f"The run cannot be {what}: {exhausted}. Grant more budget first; only an "
            "operator's grant adds budget."
        )


# --- resume ---------------------------------------------------------------------------------
def run_resume(
    *,
    tenant: Tenant,
    run_id: UUID | str,
    expected_version: int,
    reason: str = "",
    actor: Actor,
) -> Run:
    """Continue a paused, waiting or failed run from its latest checkpoint.

    One transaction: the run goes to ``running`` (version + 1, next eligible time cleared),
    the ``run.resume`` command for the new version is enqueued, the audit event written.
    A failed run resumes only while every budget has room: a run failed by an exhausted
    budget needs ``run_grant_budget`` first. The reason is optional (API.md's body is only
    ``expected_version``); the console always asks for one.

    Raises NotFound, ConcurrentCheckpointWrite, RunNotActive (cancelled, succeeded,
    cancelling), ActionNotAllowed (running, waiting for approval, reconciling) or
    BudgetExhausted.
    """
    reason = reason_clean(reason, required=False)
    with transaction.atomic():
        run = _locked_run(tenant=tenant, run_id=run_id)
        version_check(run, expected_version)
        _refuse_finished(run, "resumed")
        if run.status not in RESUMABLE:
            raise ActionNotAllowed(_NOT_RESUMABLE.get(run.status, f"The run is {run.status}."))
        _refuse_exhausted(run, "resumed")
        previous = run.status
        version = _bump(
            run,
            expected_version,
            status=RunStatus.RUNNING,
            status_reason=_said(f"resumed by {actor.name}", reason),
            next_eligible_at=None,
        )
        _continue(run, version)
        audit_record(
            tenant=tenant,
            actor=actor,
            action="run.resume",
            run_id=run.id,
            target=f"run {run.id}",
            reason=reason,
            details={"from_status": previous, "version": version},
        )
    return run_reload(run)


def _said(what: str, reason: str) -> str:
    return f"{what}: {reason}" if reason else what


def run_reload(run: Run) -> Run:
    return Run.objects.select_related("workflow", "forked_from_checkpoint").get(pk=run.pk)


# --- cancel ---------------------------------------------------------------------------------
def run_cancel(
    *,
    tenant: Tenant,
    run_id: UUID | str,
    reason: str,
    expected_version: int | None = None,
    actor: Actor,
) -> Run:
    """Stop a run. With no open operation it is ``cancelled`` at once; otherwise it is
    ``cancelling`` until every open operation is settled, and ``run_cancel_complete`` (called
    by whoever settles the last one, or by ``runs_cancel_sweep``) finishes it.

    One transaction with its audit event. Without ``expected_version`` the run's current
    version is used (the conditional update still refuses a concurrent change). Raises
    NotFound, InvalidRequest (no reason), ConcurrentCheckpointWrite or RunNotActive.
    """
    reason = reason_clean(reason)
    with transaction.atomic():
        run = _locked_run(tenant=tenant, run_id=run_id)
        expected = version_check(run, expected_version)
        if run.status in FINISHED or run.status == RunStatus.FAILED:
            raise RunNotActive(f"The run is already {run.status}; there is nothing to cancel.")
        if run.status == RunStatus.CANCELLING:
            raise RunNotActive(
                "The run is already being cancelled; it finishes once its open operations "
                "are settled."
            )
        keys = list(open_operations(run).values_list("idempotency_key", flat=True))
        who = f"cancelled by {actor.name}"
        if keys:
            status = RunStatus.CANCELLING
            status_reason = _said(
                f"cancel requested by {actor.name}; waiting for {len(keys)} open "
                "operation(s) to be settled",
                reason,
            )
        else:
            status, status_reason = RunStatus.CANCELLED, _said(who, reason)
        previous = run.status
        version = _bump(
            run, expected, status=status, status_reason=status_reason, next_eligible_at=None
        )
        if keys:
            # An event for the reconciler: these operations now block a cancel.
            outbox.outbox_enqueue(
                run=run,
                kind="run.cancel_requested",
                payload={"run_id": str(run.id), "expected_version": version, "operations": keys},
            )
        audit_record(
            tenant=tenant,
            actor=actor,
            action="run.cancel",
            run_id=run.id,
            target=f"run {run.id}",
            reason=reason,
            details={"from_status": previous, "status": status, "open_operations": keys},
        )
    return run_reload(run)


def run_cancel_complete(*, tenant: Tenant, run_id: UUID | str, actor: Actor) -> bool:
    """Finish the cancel of a ``cancelling`` run once none of its operations is open.

    The hook for reconciliation: call it after settling an operation of a cancelling run
    (it is cheap and idempotent). Returns True when it moved the run to ``cancelled``,
    False when the run is not cancelling or still has open operations. One transaction
    with its audit event ``run.cancel_completed``. Raises NotFound.
    """
    with transaction.atomic():
        run = _locked_run(tenant=tenant, run_id=run_id)
        if run.status != RunStatus.CANCELLING or open_operations(run).exists():
            return False
        version = _bump(
            run,
            run.version,
            status=RunStatus.CANCELLED,
            status_reason="cancelled: every open operation was settled first",
        )
        settled = dict(
            ExternalOperation.objects.filter(run=run).values_list("idempotency_key", "status")
        )
        audit_record(
            tenant=tenant,
            actor=actor,
            action="run.cancel_completed",
            run_id=run.id,
            target=f"run {run.id}",
            details={"version": version, "operations": settled},
        )
    log.info("run cancelled after reconciliation", extra={"run": str(run.id)})
    return True


def runs_cancel_sweep(*, limit: int = 200) -> int:
    """Complete the cancels whose operations have all been settled (any tenant); return how
    many. The periodic safety net behind ``run_cancel_complete``."""
    candidates = (
        Run.objects.filter(status=RunStatus.CANCELLING)
        .exclude(operations__status__in=OPEN_OPERATION_STATUSES)
        .select_related("tenant")
        .order_by("updated_at")[:limit]
    )
    actor = Actor.system("cancel-sweep")
    return sum(
        run_cancel_complete(tenant=run.tenant, run_id=run.id, actor=actor) for run in candidates
    )


# --- retry ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class StepChoice:
    step: str
    state: str


def retry_choices(run: Run) -> list[StepChoice]:
    """The steps an operator may retry, in the workflow's order. Code workflows name their
    steps (``definition["steps"]`` maps state → step); declarative ones have one per
    non-terminal state, named like the state."""
    definition = run.workflow.definition
    steps = definition.get("steps") or {}
    if steps:
        return [StepChoice(steps[s], s) for s in definition["states"] if s in steps]
    terminal = set(definition.get("terminal", []))
    return [StepChoice(s, s) for s in definition["states"] if s not in terminal]


def _resolve_step(run: Run, step: str) -> StepChoice:
    choices = retry_choices(run)
    by_state = [c for c in choices if c.state == step]
    matches = by_state or [c for c in choices if c.step == step]
    if len(matches) == 1:
        return matches[0]
    names = ", ".join(c.step for c in choices) or "none"
    if matches:
        raise UnknownStep(
            f"More than one state runs step '{step}'; name the state instead "
            f"({', '.join(c.state for c in matches)}).",
            fields={"step": "ambiguous"},
        )
    raise UnknownStep(
        f"Workflow {run.workflow_type} version {run.workflow_version} has no step '{step}'. "
        f"Its steps are: {names}.",
        fields={"step": "not a step of the workflow"},
    )


def run_retry(
    *,
    tenant: Tenant,
    run_id: UUID | str,
    step: str,
    reason: str,
    expected_version: int | None = None,
    actor: Actor,
) -> Run:
    """Run a named step again: append a checkpoint that moves the run to that step's state
    (backwards too), carrying the latest envelope forward with ``control.reason`` and
    ``control.actor`` set, then ``running`` with ``run.resume`` enqueued.

    The checkpoint is written by ``checkpoint_commit`` with ``operator_override`` (one way
    to write a checkpoint: same version protocol, hash chain, schema, lease and budget
    checks), inside this transaction together with the audit event. Refused while an
    operation's outcome is open (a retry must not repeat a side effect blindly).

    Raises NotFound, InvalidRequest, ConcurrentCheckpointWrite, RunNotActive, UnknownStep,
    ActionNotAllowed (open operations, reconciling), BudgetExhausted, LeaseHeld (a worker is
    executing a step) or SecretInEnvelope (the reason looks like a credential).
    """
    reason = reason_clean(reason)
    with transaction.atomic():
        run = _locked_run(tenant=tenant, run_id=run_id)
        expected = version_check(run, expected_version)
        _refuse_finished(run, "retried")
        choice = _resolve_step(run, step)
        keys = list(open_operations(run).values_list("idempotency_key", flat=True))
        if keys or run.status not in RETRYABLE:
            raise ActionNotAllowed(
                "The run has operations whose outcome is not settled ("
                + (", ".join(keys) or "reconciling")
                + "); reconcile them or record their outcome before retrying a step, so "
                "that no side effect is repeated blindly."
            )
        _refuse_exhausted(run, "retried")
        control = dict(latest_envelope(run).get("control") or {})
        control.update(
            {"actor": actor.name, "reason": reason, "action": "retry", "next_eligible_at": None}
        )
        previous_state, previous_status = run.state, run.status
        result = checkpoint_commit(
            tenant=tenant,
            run_id=run.id,
            expected_version=expected,
            state=choice.state,
            step=choice.step,
            envelope={"control": control},
            actor=actor,
            status=RunStatus.RUNNING,
            status_reason=_said(f"step {choice.step} retried by {actor.name}", reason),
            is_evidence=True,
            operator_override=True,
        )
        audit_record(
            tenant=tenant,
            actor=actor,
            action="run.retry",
            run_id=run.id,
            target=f"step {choice.step}",
            reason=reason,
            details={
                "step": choice.step,
                "state": choice.state,
                "from_state": previous_state,
                "from_status": previous_status,
                "sequence": result.sequence,
                "version": result.run_version,
            },
        )
    return run_reload(run)


# --- budget -----------------------------------------------------------------------------------
def _grant_amounts(
    attempts: int | None, tokens: int | None, cost: float | int | None
) -> dict[str, Any]:
    amounts = {"attempts": attempts, "tokens": tokens, "cost": cost}
    problems = {}
    for name in ("attempts", "tokens"):
        value = amounts[name]
        if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
            problems[name] = "a whole number"
        elif value is not None and value < 1:
            problems[name] = "at least 1"
    if cost is not None and (not isinstance(cost, int | float) or isinstance(cost, bool)):
        problems["cost"] = "a number"
    elif cost is not None and cost <= 0:
        problems["cost"] = "more than 0"
    if problems:
        raise InvalidRequest("The grant is not valid.", fields=problems)
    return {k: v for k, v in amounts.items() if v is not None}


def _parse_deadline(deadline: datetime | str | None) -> datetime | None:
    if deadline is None or isinstance(deadline, datetime):
        parsed = deadline
    else:
        try:
            parsed = datetime.fromisoformat(str(deadline).replace("Z", "+00:00"))
        except ValueError:
            parsed = None
        if parsed is None:
            raise InvalidRequest(
                "deadline must be an RFC 3339 timestamp.", fields={"deadline": "invalid"}
            )
    if parsed is not None and parsed.tzinfo is None:
        raise InvalidRequest(
            "deadline needs a time zone.", fields={"deadline": "an RFC 3339 timestamp"}
        )
    return parsed


def run_grant_budget(
    *,
    tenant: Tenant,
    run_id: UUID | str,
    reason: str,
    attempts: int | None = None,
    tokens: int | None = None,
    cost: float | int | None = None,
    deadline: datetime | str | None = None,
    expected_version: int | None = None,
    actor: Actor,
) -> Run:
    """Raise the run's budget limits by the given amounts (a later ``deadline`` extends it).

    The only way budget is added; usage is never lowered. One transaction with its audit
    event (limits before and after). It does not change the status: a run that failed for an
    exhausted budget stays failed until someone resumes it. A run that is running or
    waiting to retry gets its ``run.resume`` command again for the new version (the old one
    is now stale). A run waiting for approval is refused: the pending approval is bound to
    its version.

    Raises NotFound, InvalidRequest, ConcurrentCheckpointWrite, RunNotActive or
    ActionNotAllowed (an unlimited budget, an earlier deadline, waiting for approval).
    """
    reason = reason_clean(reason)
    amounts = _grant_amounts(attempts, tokens, cost)
    new_deadline = _parse_deadline(deadline)
    if not amounts and new_deadline is None:
        raise InvalidRequest(
            "Name what to grant: attempts, tokens, cost or a later deadline.",
            fields={"attempts": "one of attempts, tokens, cost, deadline is required"},
        )
    with transaction.atomic():
        run = _locked_run(tenant=tenant, run_id=run_id)
        expected = version_check(run, expected_version)
        _refuse_finished(run, "granted budget")
        if run.status == RunStatus.WAITING_APPROVAL:
            raise ActionNotAllowed(
                "The run waits for an approval bound to its current version; a grant now "
                "would invalidate it. Decide the approval first."
            )
        before = dict(run.budget_limits)
        limits = dict(before)
        for name, amount in amounts.items():
            key = GRANT_KEYS[name]
            if limits.get(key) is None:
                raise ActionNotAllowed(f"The run has no {name} limit; there is nothing to raise.")
            limits[key] = limits[key] + amount
        if new_deadline is not None:
            current = limits.get("deadline")
            if current is None:
                raise ActionNotAllowed("The run has no deadline; there is nothing to extend.")
            if new_deadline <= datetime.fromisoformat(current):
                raise ActionNotAllowed(
                    f"The new deadline must be later than the current one ({current})."
                )
            limits["deadline"] = new_deadline.isoformat()
        version = _bump(run, expected, budget_limits=limits)
        if run.status in (RunStatus.RUNNING, RunStatus.WAITING_RETRY):
            _continue(run, version, available_at=run.next_eligible_at)
        audit_record(
            tenant=tenant,
            actor=actor,
            action="run.budget_grant",
            run_id=run.id,
            target=", ".join(f"{k} +{v}" for k, v in amounts.items())
            + (" deadline" if new_deadline else ""),
            reason=reason,
            details={
                "granted": {
                    **amounts,
                    **({"deadline": limits["deadline"]} if new_deadline else {}),
                },
                "limits_before": before,
                "limits_after": limits,
            },
        )
    return run_reload(run)
