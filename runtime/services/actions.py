"""Operator actions on a run: the shared rules, resume and grant budget.

Cancel is in ``runtime.services.cancel``, retry in ``runtime.services.retry``, fork
in ``runtime.services.forks``. Every action

- is one transaction with its audit event (actor and reason): all of it happens or none;
- is guarded by the run's optimistic version: ``UPDATE run … WHERE id = ? AND version = ?``
  that increments the version; a stale ``expected_version`` raises
  ConcurrentCheckpointWrite (409) and nothing is written (a fork, which leaves its source
  untouched, only checks the version);
- appends and never rewrites: checkpoints are only ever added (retry, fork), statuses change.

Because every action moves the version, a command a worker holds for the old version
becomes a no-op; an action that leaves the run able to continue therefore enqueues the next
``run.resume`` itself, in the same transaction.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import F
from django.utils import timezone

from cairn import clock
from cairn.credentials import free_text_refuse
from cairn.errors import (
    ActionNotAllowed,
    BudgetExhausted,
    CairnError,
    ConcurrentCheckpointWrite,
    InvalidRequest,
    LeaseHeld,
    NotFound,
    RunNotActive,
)
from checkpoints.approvals_port import AwaitedApproval, approvals_port
from checkpoints.models import Execution, Run, RunStatus
from checkpoints.services import outbox
from checkpoints.services.approval_chain import gate_not_passed, run_approval_passage
from checkpoints.services.budgets import BUDGET_LIMIT_MAX, budget_exhausted
from checkpoints.services.changes import run_changed
from checkpoints.services.integrity import run_head_intact, run_head_refusal
from checkpoints.services.workflows import approval_action, gated_states
from telemetry.logs import transition_log
from tenants.models import Tenant
from tenants.services import Actor, audit_record

log = logging.getLogger("cairn.actions")

MAX_REASON = 2000
RESUMABLE = frozenset({RunStatus.PAUSED_FOR_REVIEW, RunStatus.WAITING_RETRY, RunStatus.FAILED})
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
    """The trimmed reason. Raises InvalidRequest when it is missing (and required) or long,
    SecretInEnvelope when it looks like a credential."""
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
    # Stored in the clear twice (the audit log, the run's status reason): never a secret.
    free_text_refuse({"reason": text})
    return text


def locked_run(*, tenant: Tenant, run_id: UUID | str) -> Run:
    """The tenant's run, its row locked for the transaction (PostgreSQL; SQLite's
    IMMEDIATE transactions already serialize writers). NotFound for another tenant's run."""
    try:
        return (
            Run.objects.select_related("workflow")
            .select_for_update(of=("self",))
            .get(tenant=tenant, pk=run_id)
        )
    except (Run.DoesNotExist, ValueError, ValidationError):
        raise no_such_run()


def no_such_run() -> NotFound:
    """The refusal for a run id the tenant has no run by (another tenant's run alike)."""
    return NotFound("No such run.")


def stale_version_error(run: Run, expected_version: int) -> ConcurrentCheckpointWrite:
    return ConcurrentCheckpointWrite(
        f"The run changed since you loaded it: it is at version {run.version}, not "
        f"{expected_version}. Nothing was done; reload the run and decide again."
    )


def version_check(run: Run, expected_version: int | None) -> int:
    if expected_version is not None and run.version != expected_version:
        raise stale_version_error(run, expected_version)
    return run.version


def version_bump(
    run: Run, expected_version: int, *, head_intact: bool = False, **fields: Any
) -> int:
    """The conditional update every action makes; returns the new version. With
    ``head_intact`` (an action that continues the run from its head) the same update also
    requires the run's row to agree with its head checkpoint's row, as a commit's statement
    does, and a tampered head raises IntegrityFailure."""
    rows = Run.objects.filter(pk=run.pk, version=expected_version)
    if head_intact:
        rows = rows.filter(run_head_intact(run))
    updated = rows.update(version=F("version") + 1, updated_at=timezone.now(), **fields)
    if updated != 1:
        run.refresh_from_db(fields=["version"])
        refusal = run_head_refusal(run) if head_intact else None
        if refusal is not None and run.version == expected_version:
            raise refusal
        raise stale_version_error(run, expected_version)
    if run.execution == Execution.EXTERNAL:
        run_changed(run_id=run.pk)  # its runner may be long-polling
    if "status" in fields:
        transition_log(
            event="run status changed",
            run_id=run.pk,
            tenant=run.tenant.slug,
            sequence=run.checkpoint_sequence,
            state=fields.get("state", run.state),
            step=fields.get("step", run.step),
            status=fields["status"],
        )
    return expected_version + 1


def enqueue_continue(run: Run, version: int, available_at: datetime | None = None) -> None:
    """Enqueue the command that lets the run go on at ``version`` (worker runs), or the
    event an external driver may watch."""
    kind = "run.resume" if run.execution == Execution.WORKER else "run.resumed"
    outbox.outbox_enqueue(
        run=run,
        kind=kind,
        payload={"run_id": str(run.id), "expected_version": version},
        available_at=available_at,
    )


# Each rule below is decided by one function that returns the refusal (or None) from the
# run's row alone: the service raises it, and the console's actions panel asks the same
# function before it offers the action, so the panel never offers what the server refuses.
def finished_refusal(run: Run, what: str) -> RunNotActive | None:
    if run.status in FINISHED:
        return RunNotActive(f"The run is {run.status}; it cannot be {what}.")
    if run.status == RunStatus.CANCELLING:
        return RunNotActive(f"The run is being cancelled; it cannot be {what}.")
    return None


def refuse_finished(run: Run, what: str) -> None:
    refusal = finished_refusal(run, what)
    if refusal:
        raise refusal


def exhausted_refusal(run: Run, what: str) -> BudgetExhausted | None:
    exhausted = budget_exhausted(run)
    if exhausted:
        return BudgetExhausted(
            f"The run cannot be {what}: {exhausted}. Grant more budget first; only an "
            "operator's grant adds budget."
        )
    return None


def refuse_exhausted(run: Run, what: str) -> None:
    refusal = exhausted_refusal(run, what)
    if refusal:
        raise refusal


# --- approval gates -------------------------------------------------------------------------
# An operator action moves a run to a checkpointed position; it must never move it past an
# approval state it has not passed. Only a commit that leaves the approval state with a
# consumed approval does (checkpoints.services.commit_rules); the chain check
# (checkpoints.services.approval_chain) says where a run legitimately is.
def gate_not_passed_for(run: Run, target: str) -> str | None:
    """The approval state an operator action may not take the run past to ``target``: one
    ``target`` lies past that the run is not past at its current position (its chain has
    not consumed that approval, or has gone back or ended since). None when there is none.
    Reads the run's chain only when ``target`` lies past an approval state."""
    definition = run.workflow.definition
    if target not in gated_states(definition):
        return None
    return gate_not_passed(definition, run_approval_passage(run), target)


# --- resume ---------------------------------------------------------------------------------
def _waiting_sentence(run: Run, awaited: AwaitedApproval | None) -> str:
    """Why a run waiting for approval has nothing to resume, naming what it waits on."""
    if awaited is None:
        return (
            f"The run waits at its approval state {run.state} with no request open for its "
            "version (the last one expired or was replaced); there is nothing to resume. "
            "Retry the step before the approval state to ask again, or cancel the run."
        )
    if awaited.status == "pending":
        return (
            f"The run waits for a decision on approval request {awaited.request_id} (pending, "
            f"open until {awaited.expires_at:%Y-%m-%d %H:%M:%S} UTC). Decide it, and the run "
            "goes on by itself; there is nothing to resume."
        )
    return (
        f"The run's approval request {awaited.request_id} is {awaited.status}; no decision "
        "is left for the run to act on. Retry the step before the approval state to ask "
        "again, or cancel the run."
    )


def resume_refusal(run: Run) -> CairnError | None:
    """Why ``run_resume`` refuses the run, from its row alone (no query), or None. A worker
    run waiting for approval is None here: whether its decided approval's command was lost
    is read by ``resume_check``. A head past an approval state it crossed without one is
    also ``resume_check``'s (it reads the chain)."""
    refusal = finished_refusal(run, "resumed")
    if refusal:
        return refusal
    if run.status == RunStatus.WAITING_APPROVAL and run.execution == Execution.WORKER:
        return None
    if run.status not in RESUMABLE:
        return ActionNotAllowed(_NOT_RESUMABLE.get(run.status, f"The run is {run.status}."))
    if run.state in (run.workflow.definition.get("terminal") or ()):
        # E.g. a rejected demo run: nothing is left to run from a final state, so a resumed
        # run would only sit in ``running`` forever.
        return ActionNotAllowed(
            f"The run ended in state {run.state}, a final state of its workflow: there is "
            "nothing left to resume. Retry a named step or fork the run instead."
        )
    return exhausted_refusal(run, "resumed")


def resume_check(run: Run) -> AwaitedApproval | None:
    """The refusals of ``run_resume`` for the run as it is, so a confirmation can show them
    before anyone confirms. Reads nothing more, except the approval a worker run waiting
    for one is bound to: returned when it is decided and only the run's command is missing
    (then a resume sends that command again). Raises RunNotActive, ActionNotAllowed or
    BudgetExhausted."""
    refusal = resume_refusal(run)
    if refusal:
        raise refusal
    if run.status == RunStatus.WAITING_APPROVAL and run.execution == Execution.WORKER:
        awaited = approvals_port().approval_awaited(run=run)
        if awaited is None or not awaited.decided:
            raise ActionNotAllowed(_waiting_sentence(run, awaited))
        return awaited
    # A head past an approval state its history crossed without one (rows older Cairn
    # wrote, or written by hand) can only end: a resume would take it into the effect.
    gate = gate_not_passed_for(run, run.state)
    if gate:
        end = "it stays failed" if run.status == RunStatus.FAILED else "it can only end: cancel it"
        raise ActionNotAllowed(
            f"The run is at {run.state}, past the approval state {gate}, but its history "
            f"crossed {gate} without a consumed approval of "
            f"'{approval_action(run.workflow.definition, gate)}': a resume would take it on "
            f"into what only an approval allows. Nothing was done; {end}."
        )
    return None


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
    budget needs ``run_grant_budget`` first. The reason is optional (in docs/api.md the
    body is only ``expected_version``); the console always asks for one.

    A worker run waiting for approval whose request is decided (its command was lost)
    gets that command again, at its current version: the version does not move, because
    the approval is bound to it, and the approval gate then moves the run on as decided.

    Raises NotFound, ConcurrentCheckpointWrite, IntegrityFailure (the run's row and its head
    checkpoint's row disagree), RunNotActive (cancelled, succeeded, cancelling),
    ActionNotAllowed (running, reconciling, waiting for a decision, a failed run whose
    latest checkpoint is in a terminal state, or one past an approval state its history
    crossed without a consumed approval) or BudgetExhausted.
    """
    reason = reason_clean(reason, required=False)
    with transaction.atomic():
        run = locked_run(tenant=tenant, run_id=run_id)
        version_check(run, expected_version)
        awaited = resume_check(run)
        if awaited is not None:
            return _resume_decided(run, awaited, reason=reason, actor=actor)
        previous = run.status
        version = version_bump(
            run,
            expected_version,
            head_intact=True,
            status=RunStatus.RUNNING,
            status_reason=said(f"resumed by {actor.name}", reason),
            next_eligible_at=None,
        )
        enqueue_continue(run, version)
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


def _resume_decided(run: Run, awaited: AwaitedApproval, *, reason: str, actor: Actor) -> Run:
    """Send a waiting run's lost command again, at its current version (the caller's
    transaction)."""
    enqueue_continue(run, run.version)
    audit_record(
        tenant=run.tenant,
        actor=actor,
        action="run.resume",
        run_id=run.id,
        target=f"run {run.id}",
        reason=reason,
        details={
            "from_status": run.status,
            "version": run.version,
            "command_sent_again": True,
            "approval_request_id": str(awaited.request_id),
            "approval_status": awaited.status,
        },
    )
    log.info(
        "command of a decided approval sent again",
        extra={"run": str(run.id), "approval_request": str(awaited.request_id)},
    )
    return run_reload(run)


def said(what: str, reason: str) -> str:
    return f"{what}: {reason}" if reason else what


def run_reload(run: Run) -> Run:
    return Run.objects.select_related("workflow", "forked_from_checkpoint").get(pk=run.pk)


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
    elif cost is not None and not 0 < cost < float("inf"):
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


def grant_refusal(run: Run) -> CairnError | None:
    """Why no grant can be made on the run, from its row alone, or None (the lease is
    ``grant_refusal_while_leased``'s: it asks the database's clock)."""
    refusal = finished_refusal(run, "granted budget")
    if refusal:
        return refusal
    if run.status == RunStatus.WAITING_APPROVAL:
        return ActionNotAllowed(
            "The run waits for an approval bound to its current version; a grant now "
            "would invalidate it. Decide the approval first."
        )
    if not any(v is not None for v in (run.budget_limits or {}).values()):
        return ActionNotAllowed("The run has no budget limit; there is nothing to raise.")
    return None


def grant_refusal_while_leased(run: Run) -> str | None:
    """Why a grant cannot be made now, or None: while someone holds the run's lease a step is
    being executed under the current version, and a grant moves the version, so that step's
    commit would be refused as stale and the step (its paid model calls too) would run again.
    """
    if not run.lease_held(clock.db_now()):  # nothing checks it again: the database's time
        return None
    return (
        f"A worker is running this run right now ({run.lease_owner} holds its lease until "
        f"{run.lease_expires_at:%Y-%m-%d %H:%M:%S} UTC); a grant now would make the step it is "
        "executing run again, model calls included. Nothing was done; grant again when it "
        "pauses, waits or fails."
    )


@dataclass(frozen=True)
class GrantPlan:
    limits: dict[str, Any]  # the run's budget limits after the grant
    granted: dict[str, Any]  # what is added (attempts, tokens, cost) and the new deadline


def grant_plan(
    run: Run,
    *,
    attempts: int | None = None,
    tokens: int | None = None,
    cost: float | int | None = None,
    deadline: datetime | str | None = None,
) -> GrantPlan:
    """The run's budget limits after granting these amounts (a later ``deadline`` extends
    it), with every refusal of ``run_grant_budget``, so a confirmation can show the limits
    after or why not before anyone confirms. Reads nothing more than the run.

    Raises InvalidRequest, RunNotActive, LeaseHeld or ActionNotAllowed.
    """
    amounts = _grant_amounts(attempts, tokens, cost)
    new_deadline = _parse_deadline(deadline)
    if not amounts and new_deadline is None:
        raise InvalidRequest(
            "Name what to grant: attempts, tokens, cost or a later deadline.",
            fields={"attempts": "one of attempts, tokens, cost, deadline is required"},
        )
    refusal = grant_refusal(run)
    if refusal:
        raise refusal
    leased = grant_refusal_while_leased(run)
    if leased:
        raise LeaseHeld(leased)
    limits = dict(run.budget_limits)
    for name, amount in amounts.items():
        key = GRANT_KEYS[name]
        if limits.get(key) is None:
            raise ActionNotAllowed(f"The run has no {name} limit; there is nothing to raise.")
        before = limits[key]
        limits[key] = before + amount
        if not limits[key] <= BUDGET_LIMIT_MAX:
            raise InvalidRequest(
                f"The {name} limit would become {limits[key]}; a budget holds at most "
                f"{BUDGET_LIMIT_MAX}.",
                fields={name: f"at most {BUDGET_LIMIT_MAX - before} more"},
            )
    if new_deadline is not None:
        current = limits.get("deadline")
        if current is None:
            raise ActionNotAllowed("The run has no deadline; there is nothing to extend.")
        if new_deadline <= datetime.fromisoformat(current):
            raise ActionNotAllowed(
                f"The new deadline must be later than the current one ({current})."
            )
        limits["deadline"] = new_deadline.isoformat()
    granted = {**amounts, **({"deadline": limits["deadline"]} if new_deadline else {})}
    return GrantPlan(limits=limits, granted=granted)


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
    its version. So is a run whose lease is held (checked under the run's row lock, which a
    worker's lease update waits for): the step being executed would have to run again.

    Raises NotFound, InvalidRequest, ConcurrentCheckpointWrite, RunNotActive, LeaseHeld (a
    worker is executing a step) or ActionNotAllowed (an unlimited budget, an earlier
    deadline, waiting for approval).
    """
    reason = reason_clean(reason)
    with transaction.atomic():
        run = locked_run(tenant=tenant, run_id=run_id)
        expected = version_check(run, expected_version)
        before = dict(run.budget_limits)
        plan = grant_plan(run, attempts=attempts, tokens=tokens, cost=cost, deadline=deadline)
        what = ", ".join(
            "a later deadline" if k == "deadline" else f"{k} +{v}" for k, v in plan.granted.items()
        )
        # The reason the page shows must not keep saying the budget is used up.
        status_reason = (
            f"budget granted by {actor.name} ({what}); resume the run to continue"
            if run.status == RunStatus.FAILED
            else f"budget granted by {actor.name} ({what})"
        )
        version = version_bump(
            run, expected, budget_limits=plan.limits, status_reason=status_reason
        )
        if run.status in (RunStatus.RUNNING, RunStatus.WAITING_RETRY):
            enqueue_continue(run, version, available_at=run.next_eligible_at)
        audit_record(
            tenant=tenant,
            actor=actor,
            action="run.budget_grant",
            run_id=run.id,
            target=", ".join(
                "deadline" if k == "deadline" else f"{k} +{v}" for k, v in plan.granted.items()
            ),
            reason=reason,
            details={
                "granted": plan.granted,
                "limits_before": before,
                "limits_after": plan.limits,
            },
        )
    return run_reload(run)
