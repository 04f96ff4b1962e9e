"""Retrying a named step: the run goes back (or forward) to that step's state with a new
checkpoint, and runs the step again.

The checkpoint is written by ``checkpoint_commit`` with ``operator_override=True``, so there
is one way to write a checkpoint: the same version protocol, hash chain, schema, lease and
budget checks; the override only lifts the declared-transition check (a retry usually moves
backwards) and lets a failed run be reopened, and only this recorded action passes it.
"""

from __future__ import annotations

from dataclasses import dataclass
from uuid import UUID

from django.db import transaction

from cairn.errors import ActionNotAllowed, CairnError, RunNotActive, UnknownStep
from checkpoints.approvals_port import approvals_port
from checkpoints.models import Checkpoint, Run, RunStatus
from checkpoints.services.approval_chain import Passage, gate_not_passed, run_approval_passage
from checkpoints.services.checkpoints import CommitRequest, checkpoint_commit
from checkpoints.services.reads import latest_envelope
from checkpoints.services.workflows import gated_states
from runtime.services.actions import (
    exhausted_refusal,
    finished_refusal,
    locked_run,
    reason_clean,
    run_reload,
    said,
    version_check,
)
from runtime.services.operations import operations_open
from tenants.models import Tenant
from tenants.services import Actor, audit_record

# Not while reconciling: a new write waits until every unknown outcome is known.
RETRYABLE = frozenset(
    {
        RunStatus.RUNNING,
        RunStatus.WAITING_RETRY,
        RunStatus.WAITING_APPROVAL,
        RunStatus.PAUSED_FOR_REVIEW,
        RunStatus.FAILED,
    }
)


@dataclass(frozen=True)
class StepChoice:
    step: str
    state: str


def workflow_steps(run: Run) -> list[StepChoice]:
    """Every step of the run's workflow, in the workflow's order. Code workflows name their
    steps (``definition["steps"]`` maps state → step); declarative ones have one per
    non-terminal state, named like the state."""
    definition = run.workflow.definition
    steps = definition.get("steps") or {}
    if steps:
        return [StepChoice(steps[s], s) for s in definition["states"] if s in steps]
    terminal = set(definition.get("terminal", []))
    return [StepChoice(s, s) for s in definition["states"] if s not in terminal]


def states_reached(run: Run) -> set[str]:
    """The states the run has been at: its own checkpoints, its current state and, for a
    fork, the states of the run it was forked from up to the checkpoint it starts from."""
    reached = {run.state, *Checkpoint.objects.filter(run=run).values_list("state", flat=True)}
    source, checkpoint = run.forked_from_run_id, run.forked_from_checkpoint_id
    for _ in range(20):  # a fork of a fork of …; the chain is short, never a loop
        if source is None or checkpoint is None:
            break
        upto = Checkpoint.objects.filter(pk=checkpoint).values_list("sequence", flat=True).first()
        if upto is None:
            break
        reached.update(
            Checkpoint.objects.filter(run_id=source, sequence__lte=upto).values_list(
                "state", flat=True
            )
        )
        source, checkpoint = (
            Run.objects.filter(pk=source)
            .values_list("forked_from_run_id", "forked_from_checkpoint_id")
            .first()
        ) or (None, None)
    return reached


def retry_refusal(
    run: Run,
    choice: StepChoice,
    reached: set[str] | None = None,
    passage: Passage | None = None,
) -> str:
    """Why ``choice`` may not be retried on the run as it is, or "" when it may: only steps
    the run has reached, and never a step past an approval state the run is not past at its
    current position (only a commit that consumes an approval of the artifact under review
    moves a run past it; ``approval_chain``). Reads the run's checkpoint states unless
    ``reached`` is given, and its chain for a step past an approval state unless
    ``passage`` is given."""
    reached = states_reached(run) if reached is None else reached
    if choice.state not in reached:
        return (
            f"The run has not reached step {choice.step} (state {choice.state}) yet; a retry "
            "runs again only a step the run has been at."
        )
    definition = run.workflow.definition
    if choice.state not in gated_states(definition):
        return ""
    passage = run_approval_passage(run) if passage is None else passage
    gate = gate_not_passed(definition, passage, choice.state)
    if gate:
        return (
            f"Step {choice.step} comes after the approval state {gate}, which the run has not "
            f"passed at its current position ({run.state}): only an approval of the artifact "
            "under review lets it continue there. Decide its approval request instead; the "
            "run continues on its own once it is approved."
        )
    return ""


def retry_choices(run: Run) -> list[StepChoice]:
    """The steps an operator may retry now, in the workflow's order (see ``retry_refusal``)."""
    reached = states_reached(run)
    steps = workflow_steps(run)
    gated = gated_states(run.workflow.definition)
    passage = run_approval_passage(run) if any(c.state in gated for c in steps) else None
    return [c for c in steps if not retry_refusal(run, c, reached, passage)]


def _resolve_step(run: Run, step: str) -> StepChoice:
    choices = workflow_steps(run)
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


def retry_run_refusal(run: Run) -> CairnError | None:
    """Why ``run_retry`` refuses any step of the run, from its row alone, or None: finished
    or cancelling, or a spent budget. The service raises it (the step's own refusals and
    open operations are checked on top); the actions panel asks it before offering Retry."""
    return finished_refusal(run, "retried") or exhausted_refusal(run, "retried")


def retry_check(run: Run, step: str) -> StepChoice:
    """Every refusal ``run_retry`` raises for ``step`` on the run as it is, in its order, or
    the step to run again: the service calls it under the run's lock, and a bulk retry's dry
    run asks it of each selected run. Raises RunNotActive, UnknownStep, ActionNotAllowed or
    BudgetExhausted."""
    spent = retry_run_refusal(run)
    if isinstance(spent, RunNotActive):
        raise spent
    choice = _resolve_step(run, step)
    refusal = retry_refusal(run, choice)
    if refusal:
        raise ActionNotAllowed(refusal, fields={"step": "not retryable now"})
    keys = list(operations_open(run=run).values_list("idempotency_key", flat=True))
    if keys or run.status not in RETRYABLE:
        raise ActionNotAllowed(
            "The run has operations whose outcome is not settled ("
            + (", ".join(keys) or "reconciling")
            + "); reconcile them or record their outcome before retrying a step, so "
            "that no side effect is repeated blindly."
        )
    if spent:
        raise spent
    return choice


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

    Only a step the run has reached, and never past an approval state the run has not passed
    (``retry_refusal``); live approval requests of the run are superseded in the same
    transaction (they are bound to the version the retry moves).

    Raises NotFound, InvalidRequest, ConcurrentCheckpointWrite, RunNotActive, UnknownStep,
    ActionNotAllowed (a step not reached or past an approval, open operations, reconciling),
    BudgetExhausted, LeaseHeld (a worker is executing a step) or SecretInEnvelope (the reason
    looks like a credential).
    """
    reason = reason_clean(reason)
    with transaction.atomic():
        run = locked_run(tenant=tenant, run_id=run_id)
        expected = version_check(run, expected_version)
        choice = retry_check(run, step)
        control = dict(latest_envelope(run).get("control") or {})
        control.update(
            {"actor": actor.name, "reason": reason, "action": "retry", "next_eligible_at": None}
        )
        previous_state, previous_status = run.state, run.status
        # The run's version moves: a live request bound to the old one can never be used.
        approvals_port().approval_requests_close(
            run=run,
            reason=f"The run moved on: step {choice.step} was retried by {actor.name}; it asks "
            "again when it reaches its approval state.",
            actor=actor,
            status="superseded",
        )
        result = checkpoint_commit(
            tenant=tenant,
            run_id=run.id,
            request=CommitRequest(
                expected_version=expected,
                state=choice.state,
                step=choice.step,
                envelope={"control": control},
                actor=actor,
                status=RunStatus.RUNNING,
                status_reason=said(f"step {choice.step} retried by {actor.name}", reason),
                is_evidence=True,
                operator_override=True,
            ),
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
