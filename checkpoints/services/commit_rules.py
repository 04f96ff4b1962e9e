"""The protocol every writer's commit is held to, checked against the run's stored workflow
definition: one rule set for Cairn's own workers and for runners in any language.

``commit_rules_check`` is called by ``checkpoint_commit`` after the run is read and the
envelope is built, before anything is written. It reads nothing the commit has not read
already, except the run's approval requests when (and only when) the commit passes an
approval state, and writes nothing. A refusal raises, and nothing is written. When the
commit passes under an approved request, ``commit_approval_consume`` consumes it inside
the commit's transaction, so it is used if and only if the run moves. Both approval steps
are the approvals app's, asked through the store's approvals port
(``checkpoints.approvals_port``): approvals sit above the store.

The rules, in order:

1. A status that ends the run well (``succeeded``) only at a terminal state, and a commit
   into a terminal state ends the run (``succeeded`` or ``failed``). (422
   ``illegal_transition``.)
2. Usage over a limit is refused (409 ``budget_exhausted``): attempts, tokens or cost
   above what the run's limits allow, including every operator grant (``grant_budget``
   raises the limits, so granted budget is allowed). A commit that fails the run may
   record the usage that exhausted it.
3. The approval invariant: a run enters the stretch past an approval state (the states it
   reaches only through it) only by leaving that approval state with a valid approval: a
   request bound to the run's current version, of the action the approval state declares,
   for an artifact the committed evidence names, approved and unexpired
   (``approval_standing`` says which). It is consumed here, once, whatever the status the
   commit sets (409 ``approval_required``, ``approval_expired``, ``approval_stale``,
   ``artifact_hash_mismatch``, ``approval_closed``). An approval consumed for this same
   version counts (the same one use). Without one, a commit may leave the approval state
   only backwards (before it) or to end the run in a terminal state (``failed``: a
   rejection ends there); nothing enters the stretch from anywhere else, and nothing goes
   on from a terminal state into it. A run inside the stretch moves freely within it.

The rules hold for every writer: workers, runners over HTTP, the LangGraph store and the
recorded operator actions (``operator_override``, a retry, lifts only the declared-transition
check). Runs are held to them inductively: each commit starts from a position an earlier
commit was held to; ``approval_chain`` checks the whole chain for ``verify`` and before an
effect or an operator action takes a run on, which catches history written any other way.
"""

from __future__ import annotations

from typing import Any, Protocol
from uuid import UUID

from cairn.errors import ApprovalRequired, BudgetExhausted, IllegalTransition
from checkpoints.approvals_port import ApprovalUse, approvals_port
from checkpoints.models import RunStatus
from checkpoints.services.budgets import LIMIT_FOR_USED
from checkpoints.services.workflows import approval_action, states_behind
from tenants.services import Actor


class RunFacts(Protocol):
    """What the rules read of the run, as the commit read it (a Run or the commit's head)."""

    id: UUID
    tenant_id: UUID
    state: str
    version: int
    workflow_type: str
    budget_limits: dict[str, Any]


def _check_status(
    run: RunFacts, definition: dict[str, Any], state: str, status: str, override: bool
) -> None:
    terminal = state in definition.get("terminal", [])
    if status == RunStatus.SUCCEEDED and not terminal:
        raise IllegalTransition(
            f"A run succeeds only at a terminal state of workflow {run.workflow_type} "
            f"({', '.join(definition.get('terminal', [])) or 'none declared'}); "
            f"'{state}' is not one.",
            fields={"status": status, "state": state},
        )
    if terminal and status not in (RunStatus.SUCCEEDED, RunStatus.FAILED):
        raise IllegalTransition(
            f"'{state}' is a terminal state: a commit into it ends the run (succeeded or "
            f"failed), not '{status}'.",
            fields={"status": status, "state": state},
        )


def _check_budgets(run: RunFacts, budgets: dict[str, Any], status: str) -> None:
    if status == RunStatus.FAILED:
        return  # the commit that ends the run records what exhausted it
    limits = run.budget_limits or {}
    over = {
        used_key: (budgets.get(used_key), limits[limit_key])
        for used_key, limit_key in LIMIT_FOR_USED.items()
        if limits.get(limit_key) is not None
        and isinstance(budgets.get(used_key), int | float)
        and budgets[used_key] > limits[limit_key]
    }
    if over:
        named = "; ".join(
            f"{key.removesuffix('_used')} used {used} of {limit}"
            for key, (used, limit) in over.items()
        )
        raise BudgetExhausted(
            f"budget exhausted: {named}. Nothing was written; only an operator's grant "
            "(POST /runs/{id}/actions/grant_budget) adds budget.",
            fields={f"budgets.{key}": f"at most {limit}" for key, (_, limit) in over.items()},
        )


def approval_to_pass(
    run: RunFacts, definition: dict[str, Any], state: str, status: str
) -> str | None:
    """The approval state a commit from ``run.state`` to ``state`` passes, whose approval it
    must consume, or None when it passes none. Raises ApprovalRequired when it would enter
    the stretch past an approval state any other way (rule 3). Reads nothing."""
    if state == run.state:
        return None
    terminal = definition.get("terminal") or ()
    for gate, stretch in states_behind(definition).items():
        if state not in stretch:
            continue
        if run.state in stretch and run.state not in terminal:
            continue  # already past it, moving within its stretch
        if run.state == gate:
            if state in terminal and status == RunStatus.FAILED:
                continue  # ends the run there (a rejection): it goes on from nowhere
            return gate
        action = approval_action(definition, gate)
        raise ApprovalRequired(
            f"'{state}' lies past the approval state '{gate}': a run enters it only by "
            f"leaving '{gate}' with a granted approval of '{action}', and the run is at "
            f"'{run.state}'. Nothing was written.",
            fields={"state": state},
        )
    return None


def commit_rules_check(
    *,
    run: RunFacts,
    definition: dict[str, Any],
    state: str,
    status: str,
    budgets: dict[str, Any],
    evidence: dict[str, Any],
    control: dict[str, Any],
    operator_override: bool = False,
) -> ApprovalUse | None:
    """Check one commit against the run's workflow ``definition`` (see the module
    docstring), with the run as the commit read it (its state and version are the ones
    being left). Writes nothing. Raises IllegalTransition, BudgetExhausted,
    ApprovalRequired or an approval code. Returns the approval the commit must consume in
    its transaction (``commit_approval_consume``) when it passes an approval state, else
    None (also when it was consumed for this version already)."""
    _check_status(run, definition, state, status, operator_override)
    _check_budgets(run, budgets, status)
    gate = approval_to_pass(run, definition, state, status)
    if gate is None:
        return None
    return approvals_port().commit_approval_check(
        run=run,
        action=approval_action(definition, gate),
        state=state,
        evidence=evidence,
        control=control,
    )


def commit_approval_consume(*, use: ApprovalUse, run: RunFacts, actor: Actor) -> None:
    """Consume ``use`` for the run at the version being left: call it inside the commit's
    transaction, so the approval is used if and only if the run moves. Raises the approval
    codes (expired, stale, closed) when it cannot be used any more."""
    approvals_port().commit_approval_consume(use=use, run=run, actor=actor)
